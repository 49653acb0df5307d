"""The stage directory's records: what one process writes another reads back as the same
record, and a damaged file is named, with what is wrong, instead of being read as nothing."""

from __future__ import annotations

import pytest

from parsl_torch.apps import identity
from parsl_torch.common import stagedir
from parsl_torch.common.outcome import Cause, Outcome, read_outcome, write_outcome


@pytest.mark.parametrize("record", [
    stagedir.CallRecord("k", {"code": "c1", "options": "o1"}),
    stagedir.ContinuationRecord("call-1", 1.5e9, step=40, save_seconds=2.5, grace=120.0),
    stagedir.BlockRecord("3", 1.7e9, 1.6e9, 1.5e9, skipped=True),
    stagedir.ProgressRecord(9, 100, "loss", 0.25, 1.5e9),
    stagedir.WarmJob("/runs/r/train", 600.0),
])
def test_a_record_reads_back_as_written(tmp_path, record):
    path = tmp_path / "r.json"
    stagedir.write(path, record)
    assert stagedir.read(path, type(record)) == record
    assert stagedir.read(tmp_path / "missing.json", type(record)) is None


def test_an_outcome_reads_back_with_its_cause(tmp_path):
    outcome = Outcome(Cause.NODE_LOST, 75, "node n2 was lost", host="n2", ranks=(2, 3))
    write_outcome(tmp_path, outcome)
    assert read_outcome(tmp_path) == outcome


@pytest.mark.parametrize("text, says", [
    ("{not json", "not a CallRecord record"),
    ("[1, 2]", "not a JSON object but list"),
    ('{"memo_key": "k"}', "field 'components' is missing"),
    ('{"memo_key": 7, "components": {}}', "field 'memo_key' is 7, not str"),
])
def test_a_damaged_record_is_named_with_what_is_wrong(tmp_path, text, says):
    path = tmp_path / stagedir.CALL
    path.write_text(text)
    with pytest.raises(stagedir.DamagedRecord) as err:
        stagedir.read(path, stagedir.CallRecord)
    assert str(path) in str(err.value) and says in str(err.value)


def test_a_damaged_call_record_reruns_the_stage_and_says_which_file(tmp_path, capfd):
    """A record the memoizer cannot read never lets a stage be skipped: it counts as no record."""
    (tmp_path / stagedir.CALL).write_text('{"memo_key": "k", "components": "garbage"}')
    assert identity.read_call(tmp_path) is None
    err = capfd.readouterr().err
    assert f"{tmp_path / stagedir.CALL}: damaged, not a CallRecord record (field 'components'" in err, err
