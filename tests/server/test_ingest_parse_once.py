"""The upload path parses a bundle's log once: ``analysis.diagnose_with_devices`` gives what the two
separate calls (``kvreport.analyze.analyze``, ``analysis.all_devices``) give, on every real case."""

from __future__ import annotations

from server_helpers import bundle_from_case

from kvreport.analyze import analyze
from kvreport_server import analysis
from tests.paths import case_dirs


def test_one_parse_gives_the_diagnosis_and_the_devices_of_two():
    named = 0
    for case in case_dirs():
        probed = bundle_from_case(case.name)
        for bundle in (probed, {**probed, "devices": []}):  # without probed devices the log's show
            diagnosis, devices = analysis.diagnose_with_devices(bundle)
            assert diagnosis == analyze(bundle), case.name
            assert devices == analysis.all_devices(bundle), case.name
            named += any(d.get("source") == "log" for d in devices)
    assert named >= 3  # some logs name their GPUs: the log half is exercised
