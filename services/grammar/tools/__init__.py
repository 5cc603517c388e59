"""Tool-call grammars: the tool contract and Hermes' JSON calls (hermes.py), Qwen's XML calls
(xml_tools.py, xml_values.py) and their parameter-name constraint (param_names.py)."""
