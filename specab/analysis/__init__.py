"""The report's pipeline, one subpackage per stage; each imports only the stages below it.

    evidence/   what the runs recorded, read into the data model: the store or run directories (model), the
                engine's server log (logparse), several stores pooled into one experiment (combine)
    measures/   numbers from an Experiment: per-arm statistics and the paired speedup (stats), the arithmetic
                of speculation (specmodel), the verdict per load (concurrency), per-phase time (phases),
                per-position acceptance (positions), the workload (workload), known truth (truthcheck)
    cost/       what a verdict costs and the design that buys the next one (design, economics, history), and the
                instance as the unit of noise: each arm's spread across restarts, the run-order trend (instances)
    findings/   the doctor's rules: sentences a user can act on, each quoting its evidence (doctor)
    render/     what a user reads: report.md/.html (report), the A/B round's table (abtable), the manifest
                diff of two runs (provenance)
"""
