"""pytest's end of the suite: the servers the classes shared stop once every
class has run, and what their shutdown reports fails the last test."""

import pytest
from xpu_common import stop_shared_servers


@pytest.fixture(scope="session", autouse=True)
def _shared_servers():
    yield
    stop_shared_servers()
