"""A runtime stand-in that records exactly what it was given (run as a script by tests).

Writes argv (as bytes), environment, pid, open fds and ignored signals to the
file named by $RECORD_TO, prints a marker on stdout, and exits with $RECORD_EXIT.
"""

import json
import os
import sys

record = {
    "argv": [os.fsencode(a).hex() for a in sys.argv[1:]],
    "argv0": sys.argv[0],
    "env": {k: v for k, v in os.environ.items() if k != "RECORD_TO"},
    "pid": os.getpid(),
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
}
with open(os.environ["RECORD_TO"], "w") as f:
    json.dump(record, f)
sys.stdout.write("recorder-stdout\n")
sys.exit(int(os.environ.get("RECORD_EXIT", "0")))
