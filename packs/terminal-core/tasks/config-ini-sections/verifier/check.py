"""Compare every section's effective values (DEFAULT inheritance applied) with the goal."""
import configparser
import sys

DEFAULT = {"image": "registry.example.com/shop", "image_tag": "2.3.2", "replicas": "2",
           "debug": "true", "region": "eu-west-1"}
WANT = {
    "staging": {**DEFAULT, "replicas": "1", "image_tag": "2.3.1"},
    "production": {**DEFAULT, "replicas": "6", "debug": "false", "region": "eu-central-1"},
    "canary": {**DEFAULT, "replicas": "1", "image_tag": "2.4.0-rc1"},
}


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


cp = configparser.ConfigParser(interpolation=None)
try:
    if not cp.read("/work/deploy.ini", encoding="utf-8"):
        fail("/work/deploy.ini is missing")
except configparser.Error as e:
    fail(f"deploy.ini does not parse: {e}")
if dict(cp.defaults()) != DEFAULT:
    fail(f"[DEFAULT] should be {DEFAULT}, got {dict(cp.defaults())}")
if sorted(cp.sections()) != sorted(WANT):
    fail(f"sections should be {sorted(WANT)}, got {cp.sections()}")
for name, want in WANT.items():
    got = dict(cp[name])
    if got != want:
        fail(f"[{name}] effective values should be {want}, got {got}")
print("PASS")
