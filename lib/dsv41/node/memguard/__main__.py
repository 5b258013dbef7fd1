"""python3 -m dsv41.node.memguard: the memory guard's command line (dsv41.node.memguard.guard)."""
from dsv41.node.memguard.guard import main

if __name__ == "__main__":
    main()
