"""`--api responses` and `--api messages` end to end against the simulator, which serves both."""

from __future__ import annotations

import pytest

from loadgen.results.reader import load_records
from servers import SimThread


@pytest.mark.parametrize("api", ["responses", "messages"])
@pytest.mark.parametrize("stream", [True, False])
def test_a_sweep_records_every_token_of_the_new_apis(api, stream, loadgen, tmp_path):
    out = tmp_path / "run"
    with SimThread(slots=2) as sim:
        code, _, err = loadgen("sweep", "--url", sim.url, "--api", api, "--concurrency", "1,2", "--requests", "4",
                               "--n-predict", "6", "--stream" if stream else "--no-stream", "--output", str(out))
    assert code == 0, err
    recs = load_records(out)
    assert len(recs) == 8 and all(r.ok for r in recs)
    assert [r.output_tokens for r in recs] == [6] * 8  # from the API's own usage (and timings where sent)
    assert all(r.usage is not None and r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 0 for r in recs)
    if stream:
        assert [r.chunks for r in recs] == [6] * 8
        assert all(r.first_token_ns is not None and r.last_token_ns >= r.first_token_ns for r in recs)
        # The Responses stream carries llama-server's timings; the Messages stream none.
        assert all((r.predicted_n == 6) == (api == "responses") for r in recs)
