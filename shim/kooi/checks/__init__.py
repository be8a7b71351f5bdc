"""kooi's check catalogue: HOST-*, ESC-* ... checks against a testinfra host.

Each check has a stable ID, the threat it covers, and returns pass / fail / na with
evidence. The same functions back Molecule's verify step (pytest-testinfra) and
`kooi verify` on a live host. See docs/checks.md.
"""

# isort: off
# Import order is registration order: the order `kooi verify` reports and pytest runs the checks in.
from .core import CHECKS, Context, Result, run_all
from . import host as _host  # noqa: F401  (registers the HOST-* checks)
from . import workload as _workload  # noqa: F401  (registers the ESC-* checks)
from . import image as _image  # noqa: F401  (registers the IMG-* checks)
from . import confinement as _confinement  # noqa: F401  (registers the ID-* checks)
from . import policy as _policy  # noqa: F401  (registers the POL-* checks)
from . import network as _network  # noqa: F401  (registers the NET-* and POL-EGRESS checks)
from . import apparmor as _apparmor  # noqa: F401  (registers the HOST-APPARMOR-* and ID-APPARMOR checks)
from . import secrets as _secrets  # noqa: F401  (registers the HOST-SECRETS-* checks)
from . import ssh as _ssh  # noqa: F401  (registers the HOST-SSH-* checks)
from . import runs as _runs  # noqa: F401  (registers the RUN-* checks)
# isort: on

__all__ = ["CHECKS", "Context", "Result", "run_all"]
