"""Where the checkout's parts are: its root (units/, pi/), conf/ (the profiles and the monitoring
templates) and lib/ (what is shipped to the nodes and run by the head's services)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CONF_DIR = ROOT / "conf"
LIB_DIR = str(ROOT / "lib")
