"""Print ``name==version`` for each package a pip install plan (``pip install --dry-run
--report``) would replace whose installed copy pip cannot uninstall: one the distribution
installed (``/usr/lib/python3/dist-packages``, no RECORD). Debian's pip used to leave such a
copy in place and install the new version beside it (``/usr/local``, first on sys.path: its
hands-off-system-packages patch, still in Debian 12's 23.0 and Ubuntu 22.04's 22.0); the pips
of Ubuntu 24.04 (24.0), Debian trixie and sid do not have it and stop with "Cannot uninstall
numpy 1.26.4, RECORD file not found. Hint: The package was installed by debian." Installing
these first, with ``--ignore-installed --no-deps``, does what the patch did."""

import json
import sys
from importlib import metadata

with open(sys.argv[1], encoding="utf-8") as f:
    plan = json.load(f)
for item in plan.get("install", []):
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    try:
        installed = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    if installed.read_text("RECORD") is None:
        print(f"{name}=={version}")
