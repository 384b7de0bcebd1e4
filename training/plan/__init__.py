"""Know before paying: one request's per-GPU peak memory by part, its time and its cost, in closed form.

Pure Python (standard library and ``training.contract`` only, no torch): it runs in the request-check Lambda, in
the operator CLI and at synth. ``python -m training.plan RUN.json [--json]`` prints the closed form. The
measured reference it is checked against lives with the development measurements, which import this module and
never the other way round: ``python -m training.measure.memory_trace --request RUN.json`` traces one real FSDP2 step
of the trainer's own model on this CPU, and ``python -m training.measure.plan_agreement`` prints the agreement
table.

By job: ``inputs`` (a request's settings -> the ``Setup``), ``memory`` (the per-GPU peak by part), ``band`` and
``timing`` (throughput, time and cost, with where each figure comes from), ``network`` (the collectives of a
multi-instance layout), ``advice`` (the smallest changes that fit), ``estimate`` (the whole plan), ``refusal`` (its
refusal text), ``report`` (the plan in words, the command line), ``measured`` (the stored tuning measurements that
replace an estimate) and ``layouts`` (the data-parallel layouts compared).
"""
