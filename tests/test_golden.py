"""doit plan's text, the units doit render writes, decide()'s steps and the release history's text for
fixed inputs (tests/records/golden.py), byte for byte as e8d141c gave them (tests/records/golden-e8d141c)
or, for the gateway's cases and the release machine's walk, as ab646fb did before the serving layout and
the head's services were reshaped (tests/records/golden-ab646fb), except the cases a fix changed on
purpose (FIXED says which), whose expected text is in tests/records/golden-fixed."""
import importlib.util
import pathlib

RECORDS = pathlib.Path(__file__).parent / "records"
_spec = importlib.util.spec_from_file_location("golden", RECORDS / "golden.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)

GID_0 = "a per-node GID index of 0 is kept, no longer lost to NCCL_IB_GID_INDEX or detection"
CACHES = ("the rank unit mounts the image's own cache folder ($STATE_DIR/cache/<digest's first 12 hex>), makes "
          "each library's folder in it and points each library at its own (names.ENGINE_CACHES)")
SOCKET = ("dsv41-gateway.socket holds PORT and HAProxy takes it (bind fd@3): its unit rendered and installed, "
          "stopped first with the gateway, the config checked as its copy (haproxy.check.cfg)")
FIXED = {                                   # case: the fix that changed its output since its record
    "plan-profile": GID_0,
    "plan-unchanged-gid-0-given": GID_0,
    "render-profile-gid-0": f"{GID_0}; {CACHES}",
    "render-three-nodes": f"{GID_0}; {CACHES}",
    "decide-gid-0-given": GID_0,
    "plan-worker-unreachable": "doit plan names the ssh failure of a node it could not ask",
    "plan-nothing-installed": CACHES,
    "plan-one-unit-differs": CACHES,
    "render-defaults": CACHES,
    "render-gateway": f"{CACHES}; {SOCKET}",
    "decide-gateway": SOCKET,
}


RECORDED = {p.stem: p for d in ("golden-e8d141c", "golden-ab646fb") for p in (RECORDS / d).glob("*.txt")}


def test_outputs_are_the_recorded_ones():
    got = golden.outputs()
    assert sorted(got) == sorted(RECORDED)
    for name, text in got.items():
        want = RECORDS / "golden-fixed" / f"{name}.txt" if name in FIXED else RECORDED[name]
        assert text.encode() == want.read_bytes(), f"{name} differs from {want}"


def test_each_fixed_case_differs_from_its_record():
    assert sorted(FIXED) == sorted(p.stem for p in (RECORDS / "golden-fixed").glob("*.txt"))
    for name in FIXED:
        assert (RECORDS / "golden-fixed" / f"{name}.txt").read_bytes() != RECORDED[name].read_bytes(), name
