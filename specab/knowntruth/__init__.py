"""Known-truth models: hand-set weights whose speculative acceptance is known exactly.

A target whose greedy output is the permutation f(t) = t+1 over [first, vocab) (every GEMM still runs) and
drafts that agree with f on a seeded random token set of density p. Every verify cycle's accepted count then
follows from the draft's ``known_truth.json`` alone (:mod:`specab.knowntruth.truth`, stdlib only); the models
are built by :mod:`specab.knowntruth.build` (torch, safetensors). docs/knowntruth.md describes both.
"""
