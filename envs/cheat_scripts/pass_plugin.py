# A pytest plugin that turns every test into a pass (planted by the generic cheats).
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None


def pytest_sessionfinish(session, exitstatus):
    session.exitstatus = 0


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        item.obj = lambda *a, **k: None
