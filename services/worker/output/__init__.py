"""One request's output side: matcher transactions and what becomes published text.

    session.py       OutputSession: lookahead, preview, confirm, discard (matcher transactions)
    text.py          UTF-8 publication: bytes of an unfinished character are held back
    stop_strings.py  stop strings of unconstrained requests
    tool_stream.py   tool-call events decoded from the text through the model's tool format
    report.py        the constraint report
"""
