"""The matcher companions' per-vocabulary indices are built once per vocabulary and kept; a
served worker builds them before health says ok (services/embedded.py), so the first request
that needs one does not pay it on its TTFT."""

from services.grammar.client import build_companion_indices
from services.grammar.json_index import JsonNameIndex
from services.grammar.json_lengths import JsonLengthIndex
from services.grammar.tools.param_names import NameIndex
from services.grammar.tools.raw_lengths import LengthIndex
from shared.frontends import get_frontend


def test_the_indices_built_at_start_are_the_ones_requests_use():
    domain = get_frontend("smollm2").domain
    assert build_companion_indices(domain) >= 0.0
    built = [index.of(domain) for index in (JsonNameIndex, JsonLengthIndex, NameIndex,
                                             LengthIndex)]
    again = [index.of(domain) for index in (JsonNameIndex, JsonLengthIndex, NameIndex,
                                             LengthIndex)]
    assert all(a is b for a, b in zip(built, again))
