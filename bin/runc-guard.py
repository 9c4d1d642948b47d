#!python
# The shim containerd runs as its runtime BinaryName. Kept to two imports and a
# signal note: this file runs on every runtime call of every container (see
# runc_guard.shim.entry); the handlers go first so a signal during the imports is
# honoured by main() instead of printing a KeyboardInterrupt traceback.
# pip writes this line as `#!<venv>/bin/python` and drops any flag; `make venv`
# adds -IS back, so the tests and benches run the shim the way the .deb's
# /usr/bin/runc-guard runs (~7 ms less CPU per call: no site, no .pth files).
import sys

if sys.flags.no_site:  # `python -IS`, as `make venv` installs it: this venv's packages by hand
    sys.path.append(sys.executable.rsplit("/", 2)[0] + "/lib/python%d.%d/site-packages" % sys.version_info[:2])
import _signal

_noted = []  # SIGTERM/SIGINT/SIGHUP before the shim can act: noted, never a traceback
for _signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
    if _signal.getsignal(_signum) != _signal.SIG_IGN:  # ignored by the caller: the runtime inherits that
        _signal.signal(_signum, lambda signum, _frame: _noted.append(signum))
from runc_guard.shim.entry import main

sys.exit(main(_noted))
