"""The tests' shared helpers, one module per concept: stand-in servers (``standins``), the fault
proxy (``faultproxy``), a group on the stand-ins (``group``), the one poll helper (``wait``),
member processes (``member``, ``handler_member``, ``scenario``), and the helpers of each room's
tests (``handlers``, ``cli``, ``sinks``, ...). Imported as ``from support.wait import eventually``
from any test folder: pyproject's ``[tool.pytest.ini_options] pythonpath = ["tests"]``.
No test file imports another; what two test files share lives here.
"""
