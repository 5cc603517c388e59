"""One request's output side: matcher transactions and what becomes published text.

    session.py       OutputSession: lookahead, preview, confirm, discard (matcher transactions)
    preview.py       the provisional accept of produced tokens, before the Program commits them
    positions.py     mask position states (Ready, DeadEnd, Unreachable), the filler row
    stop_strings.py  stop strings of unconstrained requests
    report.py        the constraint report

Tool-call events are decoded by the model's tool format (shared/frontends/formats/).
"""
