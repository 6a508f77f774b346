"""Cross-device comparison reports (``roller compare``).

``report.build(ops, hws, ...)`` constructs, predicts and renders every op for every description and summarizes
(``collect``, ``summary``, ``why``, ``plots``); ``report.write_files`` writes index.html, report.md,
results.csv and results.json. ``measured`` reads timings other commands saved.
"""
