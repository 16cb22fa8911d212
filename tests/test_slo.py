"""The latency-target rule (analysis/slo.py): parsing, each request's judgement, a level's
attainment, goodput, misses and margins. Expected answers were written before the code ran."""

from __future__ import annotations

import msgspec
import pytest

from loadgen.analysis.slo import Slo, SloError, SloTally, judge, parse_slo
from loadgen.core.records import RequestRecord

MS = 1_000_000


def rec(ttft_ms=None, e2e_ms=1000.0, tokens=11, error=None, prompt_ms=None, predicted_ms=None, gaps_ms=None,
        seq=0) -> RequestRecord:
    """A request sent at 0 and completed at e2e_ms; streamed when ttft_ms is given (the last token
    at e2e_ms, so tpot = (e2e - ttft) / (tokens - 1))."""
    return RequestRecord(
        target="t", level=1, worker=0, seq=seq, salt="", send_ns=0, complete_ns=int(e2e_ms * MS), error_kind=error,
        predicted_n=None if error else tokens, prompt_ms=prompt_ms, predicted_ms=predicted_ms,
        first_token_ns=None if ttft_ms is None else int(ttft_ms * MS),
        last_token_ns=None if ttft_ms is None else int(e2e_ms * MS),
        chunk_gaps_us=None if gaps_ms is None else [int(g * 1000) for g in gaps_ms])


@pytest.mark.parametrize("text, expected", [
    ("ttft=500ms,tpot=50ms,e2e=8s", (("ttft", 500.0), ("tpot", 50.0), ("e2e", 8000.0))),
    ("e2e=8s,ttft=0.5s", (("ttft", 500.0), ("e2e", 8000.0))),  # put in TARGETS order
    ("queue=250", (("queue", 250.0),)),  # a bare number is ms
    ("itl=100ms, tpot = 40ms", (("tpot", 40.0), ("itl", 100.0))),
    ("e2e=1m", (("e2e", 60000.0),)),
    ("ttft:300ms", (("ttft", 300.0),)),
])
def test_parse_slo(text, expected):
    assert parse_slo(text).targets_ms == expected


@pytest.mark.parametrize("text, attainment, says", [
    ("ttft=500ms,foo=3s", 0.9, "unknown target 'foo'"),
    ("ttft=500ms,ttft=400ms", 0.9, "ttft given twice"),
    ("ttft=fast", 0.9, "cannot read 'ttft=fast'"),
    ("ttft=0ms", 0.9, "must be above 0"),
    ("e2e=1e-400s", 0.9, "e2e must be above 0"),  # underflows to 0
    ("e2e=1e400", 0.9, "'e2e=1e400' is not a finite time"),
    ("ttft=500ms, e2e=1e400s", 0.9, "'e2e=1e400s' is not a finite time"),
    ("e2e=1e306m", 0.9, "'e2e=1e306m' is not a finite time"),  # finite as written, infinite in ms
    ("", 0.9, "no target given"),
    ("ttft=500ms", 1.5, "--attainment 1.5 is not a share"),
    ("ttft=500ms", 0.0, "--attainment 0 is not a share"),
])
def test_parse_slo_refuses_in_one_sentence(text, attainment, says):
    with pytest.raises(SloError, match=says):
        parse_slo(text, attainment)


SLO = Slo((("ttft", 500.0), ("tpot", 50.0), ("e2e", 8000.0)))


@pytest.mark.parametrize("record, missed", [
    (rec(ttft_ms=400, e2e_ms=900, tokens=11), ()),  # tpot (900-400)/10 = 50: at the target is good
    (rec(ttft_ms=500.5, e2e_ms=900, tokens=11), ("ttft",)),
    (rec(ttft_ms=400, e2e_ms=910, tokens=11), ("tpot",)),  # tpot 51
    (rec(ttft_ms=600, e2e_ms=9000, tokens=11), ("ttft", "tpot", "e2e")),  # tpot 840
    (rec(error="timeout"), ("error",)),
    (rec(error="http_503", ttft_ms=1), ("error",)),  # an error misses whatever its times
    (rec(ttft_ms=None, e2e_ms=900), ("unjudged",)),  # no stream: ttft and tpot cannot be judged
    (rec(ttft_ms=100, e2e_ms=900, tokens=1), ("unjudged",)),  # one token: no tpot
    (rec(ttft_ms=100, e2e_ms=9000, tokens=1), ("e2e", "unjudged")),
])
def test_judge_table(record, missed):
    assert judge(record, SLO) == missed


@pytest.mark.parametrize("gaps, prompt_ms, predicted_ms, missed", [
    ([10, 20, 99], 100, 200, ()),  # longest gap 99 <= 100; queue 1000 - 300 = 700 <= 800
    ([10, 101], 100, 200, ("itl",)),
    ([10], 50, 100, ("queue",)),  # queue 850
    ([10], None, None, ("unjudged",)),  # no timings: no queue wait
])
def test_judge_itl_and_queue(gaps, prompt_ms, predicted_ms, missed):
    slo = parse_slo("itl=100ms,queue=800ms")
    r = rec(ttft_ms=50, e2e_ms=1000, gaps_ms=gaps, prompt_ms=prompt_ms, predicted_ms=predicted_ms)
    assert judge(r, slo) == missed


# (first token, first answer token, reasoning tokens) -> missed, against ttft=500ms,ttfa=2s, written
# first: a reasoning model's first token is its thinking; the answer comes later (TTFA, which --slo
# did not know). Without reasoning the first answer token is the first token.
@pytest.mark.parametrize("ttft_ms, answer_ms, reasoning, missed", [
    (300, 1500, 40, ()),
    (300, 2500, 40, ("ttfa",)),  # quick to think, slow to answer
    (600, 1500, 40, ("ttft",)),
    (600, None, None, ("ttft",)),  # no reasoning: TTFA = TTFT = 600 ms, within 2 s
    (300, None, 40, ("unjudged",)),  # reasoned, and no answer token came
])
def test_judge_ttfa(ttft_ms, answer_ms, reasoning, missed):
    r = msgspec.structs.replace(rec(ttft_ms=ttft_ms, e2e_ms=3000), reasoning_tokens=reasoning,
                                first_answer_ns=None if answer_ms is None else int(answer_ms * MS))
    assert judge(r, parse_slo("ttfa=2s,ttft=500ms")) == missed
    assert parse_slo("ttfa=2s,ttft=500ms").names == ("ttft", "ttfa")  # TARGETS order


def test_level_attainment_goodput_and_margins():
    # 10 requests over a 2 s level (send 0 .. last complete 2000 ms), e2e=1500ms only, attainment 0.9:
    # 8 good (e2e 100..800 ms, 10 tokens each), one late (1800 ms), one error, one cancelled (not judged).
    slo = parse_slo("e2e=1500ms", 0.9)
    good = [rec(e2e_ms=100 * (i + 1), tokens=10, seq=i) for i in range(8)]
    late = rec(e2e_ms=1800, tokens=10, seq=8)
    failed = RequestRecord(target="t", level=1, worker=0, seq=9, salt="", send_ns=0, complete_ns=2000 * MS,
                           error_kind="http_500")
    cancelled = RequestRecord(target="t", level=1, worker=0, seq=10, salt="", send_ns=0, complete_ns=50 * MS,
                              error_kind="cancelled")
    result = SloTally.of(slo, [*good, late, failed, cancelled]).result(wall_s=2.0)
    assert (result.judged, result.good) == (10, 8)
    assert result.attainment == pytest.approx(0.8)
    assert result.passed is False
    assert result.goodput_req_s == pytest.approx(4.0)
    assert result.goodput_tok_s == pytest.approx(40.0)
    assert result.misses == {"e2e": 1, "error": 1}
    assert result.most_missed == "e2e"
    # rank ceil(0.9·10) = 9 of the ratios (0.067 .. 0.533, 1.2, inf): 1.2
    assert result.ratio == {"e2e": pytest.approx(1.2)}
    assert result.score == pytest.approx(1.2)


@pytest.mark.parametrize("n_good, n_late, attainment, passed, score_at_most_one", [
    (9, 1, 0.9, True, True),  # 0.9 >= 0.9 passes; rank 9 is a good one
    (8, 2, 0.9, False, False),
    (10, 0, 1.0, True, True),
    (9, 1, 1.0, False, False),  # 1.0 asks for every request
    (1, 1, 0.5, True, True),
])
def test_pass_and_score_agree(n_good, n_late, attainment, passed, score_at_most_one):
    slo = parse_slo("e2e=1s", attainment)
    rs = [rec(e2e_ms=500) for _ in range(n_good)] + [rec(e2e_ms=1500) for _ in range(n_late)]
    result = SloTally.of(slo, rs).result(1.0)
    assert result.passed is passed
    assert (result.score <= 1) is score_at_most_one


def test_most_missed_ties_go_to_the_first_target_and_errors_only_when_no_target_missed():
    slo = parse_slo("ttft=100ms,e2e=1s")
    tie = SloTally.of(slo, [rec(ttft_ms=200, e2e_ms=500), rec(ttft_ms=50, e2e_ms=2000)]).result(1.0)
    assert tie.most_missed == "ttft"
    errors_only = SloTally.of(slo, [rec(error="timeout"), rec(error="timeout")]).result(1.0)
    assert errors_only.most_missed == "error"
    assert errors_only.score is None and errors_only.attainment == 0.0


def test_nothing_judged_never_passes():
    result = SloTally.of(parse_slo("e2e=1s"), []).result(0.0)
    assert result.attainment is None and result.passed is False and result.goodput_req_s == 0.0


@pytest.mark.parametrize("seed", range(20))
def test_the_tally_judges_each_request_as_judge_does(seed):
    # SloTally.add reads each target's value once a request; judge() and _ratios() are the rule, one
    # record at a time. Random records (tests/test_metric_defs.py): failed, cancelled, unstreamed,
    # without timings or tokens.
    import random

    from loadgen.analysis.slo import SloTally, _ratios, judge, parse_slo
    from loadgen.core.records import CLIENT_SIDE
    from test_metric_defs import random_record

    rng = random.Random(seed)
    batch = [random_record(rng, i) for i in range(rng.randrange(1, 80))]
    slo = parse_slo(rng.choice(["ttft=800ms,tpot=40ms,e2e=3s", "e2e=2s", "itl=20ms,queue=300ms", "ttfa=1s,e2e=4s"]))
    tally = SloTally.of(slo, batch)
    judged = [r for r in batch if r.error_kind not in CLIENT_SIDE]
    verdicts = [judge(r, slo) for r in judged]
    misses: dict[str, int] = {}
    for missed in verdicts:
        for name in missed:
            misses[name] = misses.get(name, 0) + 1
    assert (tally.judged, tally.good) == (len(judged), sum(1 for v in verdicts if not v))
    assert tally.misses == misses
    assert tally.good_tokens == sum(r.output_tokens or 0 for r, v in zip(judged, verdicts) if not v)
    assert tally.ratios == [_ratios(r, slo) for r in judged]
