"""Run.tok_s computes statistics.median's arithmetic inline (the doctor asks for it ~260,000 times in a
1,000-run experiment): it must give the very same number, or None, for any mix of requests."""
import random
import statistics

from specab.analysis.evidence.model import Request, Run


def test_tok_s_is_the_median_of_the_measured_requests_decode_tok_s():
    rng = random.Random(1)
    for _ in range(5000):
        reqs = [Request(i=i, warmup=rng.random() < .2, ok=rng.random() < .9,
                        decode_tok_s=rng.choice([None, 0.0, rng.uniform(1, 100), 5, 7, float("inf")]))
                for i in range(rng.randint(0, 12))]
        run = Run(run_id="001-x", arm="x", requests=reqs)
        v = [q.decode_tok_s for q in run.measured if q.decode_tok_s]
        want = statistics.median(v) if v else None
        got = run.tok_s
        assert got == want and type(got) is type(want), (v, got, want)
