"""The constraints `infernix bench grammar` measures, each with outputs a user would get from it.

Categories (the rows `GOALS` in grammar.py judges): typical response schemas; strings with maxLength
60 and 1000 (with minLength); strings with pattern; GBNF written the way llama.cpp users write it (a
JSON grammar with the classic string rule, an array of objects, a C-like language, arithmetic, a
list, free English- and Japanese-like text); Hermes tool grammars. The GBNF texts are written in the
llama.cpp dialect (empty alternatives, `{m,n}`, dashed names) as users bring them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shared.contract import OutputConstraint, ToolChoice, ToolDefinition, ToolMode


@dataclass(frozen=True)
class Case:
    name: str
    category: str  # "schema" | "bounded" | "pattern" | "gbnf" | "tools"
    constraint: Any  # OutputConstraint or ToolSpec
    outputs: tuple[str, ...]


def _schema(
    name: str, category: str, schema: dict, *values: Any, indent: int | None = None
) -> Case:
    texts = tuple(json.dumps(v, ensure_ascii=False, indent=indent) for v in values)
    # `any`, the contract's layout and the costliest: runs of up to 32 whitespace characters
    return Case(name, category, OutputConstraint.json_schema(schema, whitespace="any"), texts)


PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
    "email": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age"], "additionalProperties": False}
FORECAST = {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"},
    "forecast": {"type": "array", "items": {"type": "object", "properties": {
        "day": {"type": "string", "enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]},
        "high": {"type": "number"}, "low": {"type": "number"}, "summary": {"type": "string"}},
        "required": ["day", "high", "low", "summary"], "additionalProperties": False}}},
    "required": ["city", "days", "forecast"], "additionalProperties": False}
ORDER = {"type": "object", "properties": {
    "order_id": {"type": "integer", "minimum": 1},
    "customer": {"type": "object", "properties": {"name": {"type": "string"},
                                                  "email": {"type": "string"}},
                 "required": ["name"]},
    "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1, "maximum": 100},
        "price": {"type": "number", "minimum": 0}}, "required": ["sku", "qty", "price"]}},
    "gift": {"type": "boolean"}, "notes": {"type": ["string", "null"]},
    "status": {"enum": ["pending", "paid", "shipped"]}},
    "required": ["order_id", "items", "status"]}

_LONG = ("The committee met on Tuesday to review the \"harbour\" proposal.\nMembers asked about "
         "costs, the timeline (eighteen months) and the effect on local fishing; the chair noted "
         "that a tab\tseparated annex lists every objection received so far. ")

SCHEMAS: list[Case] = [
    _schema(
        "person",
        "schema",
        PERSON,
        {
            "name": "Ada Lovelace",
            "age": 36,
            "email": "ada@example.org",
            "tags": ["mathematics", "poetry", "engines"],
        },
        {"name": "Alan Turing", "age": 41, "tags": []},
    ),
    _schema(
        "forecast",
        "schema",
        FORECAST,
        {
            "city": "Shanghai",
            "days": 2,
            "forecast": [
                {
                    "day": "mon",
                    "high": 21.5,
                    "low": 14.0,
                    "summary": "Light rain in the afternoon.",
                },
                {
                    "day": "tue",
                    "high": 24.25,
                    "low": 15.5,
                    "summary": "Sunny with a gentle breeze.",
                },
            ],
        },
    ),
    _schema(
        "order",
        "schema",
        ORDER,
        {
            "order_id": 1042,
            "customer": {"name": "Grace Hopper", "email": "grace@navy.mil"},
            "items": [
                {"sku": "KB-101", "qty": 2, "price": 49.99},
                {"sku": "MS-7", "qty": 1, "price": 19.5},
            ],
            "gift": False,
            "notes": None,
            "status": "paid",
        },
        indent=2,
    ),
    _schema(
        "maxlen60",
        "bounded",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 60},
                "tags": {
                    "type": "array",
                    "maxItems": 5,
                    "items": {"type": "string", "maxLength": 60},
                },
            },
            "required": ["title", "tags"],
            "additionalProperties": False,
        },
        {
            "title": 'Harbour proposal: "phase two" review and next steps',
            "tags": ["harbour", "budget \u2014 2027", "fishing rights"],
        },
    ),
    _schema(
        "maxlen1000_min20",
        "bounded",
        {
            "type": "object",
            "properties": {"summary": {"type": "string", "minLength": 20, "maxLength": 1000}},
            "required": ["summary"],
            "additionalProperties": False,
        },
        {"summary": (_LONG * 3)[:990]},
    ),
    _schema(
        "pattern",
        "pattern",
        {
            "type": "object",
            "properties": {
                "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "slug": {"type": "string", "pattern": "^[a-z0-9]+(-[a-z0-9]+)*$"},
                "note": {"type": "string", "pattern": "^[A-Za-z ,.'-]+$"},
            },
            "required": ["date", "sku", "slug", "note"],
            "additionalProperties": False,
        },
        {
            "date": "2026-12-01",
            "sku": "HBR-2027",
            "slug": "harbour-phase-two-review",
            "note": "Members asked about costs, the timeline and the effect on local fishing.",
        },
    ),
]

_JSON_VALUE = r'''
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws
array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws
string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
# optional space, after literal characters where allowed
ws ::= | " " | "\n" [ \t]{0,20}
'''

GBNF_JSON = "root   ::= object" + _JSON_VALUE
GBNF_JSON_ARR = r'''root ::= arr
arr  ::=
  "[\n" ws (
            value
    (",\n" ws value)*
  )? "]"
''' + _JSON_VALUE
GBNF_C = r'''root ::= (declaration)*
declaration ::= dataType sp identifier "(" parameter? ")" ws "{" ws statement* "}" ws
dataType  ::= "int" | "float" | "char" | "void"
identifier ::= [a-zA-Z_] [a-zA-Z_0-9]*
parameter ::= dataType sp identifier ( "," ws dataType sp identifier )*
statement ::= (
    ( dataType sp identifier ws "=" ws expression ";" ) |
    ( identifier ws "=" ws expression ";" ) |
    ( identifier ws "(" argList? ")" ";" ) |
    ( "return" sp expression ";" ) |
    ( "while" ws "(" condition ")" ws "{" ws statement* "}" ) |
    ( "for" ws "(" forInit ";" ws condition ";" ws forUpdate ")" ws "{" ws statement* "}" ) |
    ( "if" ws "(" condition ")" ws "{" ws statement* "}" ( ws "else" ws "{" ws statement* "}" )? ) |
    ( singleLineComment ) |
    ( multiLineComment )
  ) ws
forInit ::= dataType sp identifier ws "=" ws expression | identifier ws "=" ws expression
forUpdate ::= identifier ws "=" ws expression | identifier "++"
condition ::= expression relationOperator expression
relationOperator ::= ws ("<=" | "<" | "==" | "!=" | ">=" | ">") ws
expression ::= term (ws ("+" | "-") ws term)*
term ::= factor (ws ("*" | "/") ws factor)*
factor ::= identifier | number | unaryTerm | funcCall | parenExpression
unaryTerm ::= "-" factor
funcCall ::= identifier "(" argList? ")"
parenExpression ::= "(" ws expression ws ")"
argList ::= expression ("," ws expression)*
number ::= [0-9]+
singleLineComment ::= "//" [^\n]* "\n"
multiLineComment ::= "/*" ( [^*] | ("*" [^/]) )* "*/"
sp ::= [ \t\n]+
ws ::= [ \t\n]*
'''
GBNF_ARITH = r'''root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] ws term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
'''
GBNF_LIST = r'''root ::= item+

# no line breaks inside an item
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
'''
GBNF_ENGLISH = r'''root        ::= en-char+ ([ \t\n] en-char+)*
en-char     ::= letter | digit | punctuation
letter      ::= [a-zA-Z]
digit       ::= [0-9]
punctuation ::= [!"#$%&'()*+,-./:;<=>?@[\\\]^_`{|}~]
'''
GBNF_JAPANESE = r'''root        ::= jp-char+ ([ \t\n] jp-char+)*
jp-char     ::= hiragana | katakana | punctuation | cjk
hiragana    ::= [ぁ-ゟ]
katakana    ::= [ァ-ヿ]
punctuation ::= [、-〾]
cjk         ::= [一-鿿]
'''

_C_PROGRAM = """int add(int a, int b) {
  return a + b;
}
int main() {
  int total = 0;
  for (int i = 0; i < 10; i = i + 1) {
    total = add(total, i * 2);
  }
  if (total > 50) {
    printf(total);
  } else {
    total = total - 1;
  }
  // done
  return total;
}
"""

GBNF = [
    Case(
        "gbnf_json",
        "gbnf",
        OutputConstraint.grammar(GBNF_JSON),
        (
            json.dumps(
                {
                    "name": 'Ada "the countess"',
                    "born": 1815,
                    "fields": ["maths", "poetry"],
                    "alive": False,
                    "notes": None,
                },
                indent=2,
            ),
            json.dumps({"id": 7, "tags": {"a": "x\ny", "b": [1.5, -2e3]}}),
        ),
    ),
    Case(
        "gbnf_json_arr",
        "gbnf",
        OutputConstraint.grammar(GBNF_JSON_ARR),
        (
            "[\n"
            + ",\n".join(
                json.dumps(v)
                for v in (
                    {"city": "Paris", "temp": 21.5, "sky": "clear"},
                    {"city": "Oslo", "temp": -3, "sky": 'snow "heavy"'},
                    {"city": "Lima", "temp": 18, "sky": "overcast"},
                )
            )
            + "]",
        ),
    ),
    Case("gbnf_c", "gbnf", OutputConstraint.grammar(GBNF_C), (_C_PROGRAM,)),
    Case(
        "gbnf_arith",
        "gbnf",
        OutputConstraint.grammar(GBNF_ARITH),
        ("x + 2 * y = total\n(rate * 12) - fee = yearly\nn / 4 = quarter\n",),
    ),
    Case(
        "gbnf_list",
        "gbnf",
        OutputConstraint.grammar(GBNF_LIST),
        (
            "- Buy bread, milk and eggs\n- Call the plumber about the kitchen sink\n"
            "- Book tickets for the 18:30 train to Lyon\n",
        ),
    ),
    Case(
        "gbnf_english",
        "gbnf",
        OutputConstraint.grammar(GBNF_ENGLISH),
        (
            "The harbour committee met on Tuesday (at 10:30) to review costs, timelines and "
            "objections; members agreed to publish the annex by Friday.",
        ),
    ),
    Case(
        "gbnf_japanese",
        "gbnf",
        OutputConstraint.grammar(GBNF_JAPANESE),
        (
            "港の委員会は火曜日に会合を開き、費用と日程を検討した。"
            " 次の会合は金曜日に予定されている。",
        ),
    ),
]


def _tool_cases() -> list[Case]:
    from services.grammar.tools.hermes import ToolSpec

    weather = ToolDefinition.create("get_weather", {
        "type": "object", "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}, strict=True)
    search = ToolDefinition.create("search_docs", {
        "type": "object", "properties": {
            "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
        "required": ["query"], "additionalProperties": False}, strict=True)
    call = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
            '"celsius"}}\n</tool_call>')
    call2 = ('<tool_call>\n{"name": "search_docs", "arguments": {"query": "harbour proposal '
             'costs", "limit": 5}}\n</tool_call>')
    tools = (weather, search)
    return [
        Case("hermes_required", "tools",
             ToolSpec(tools, ToolChoice(ToolMode.REQUIRED, None, True)), (call + "\n" + call2,)),
        Case("hermes_auto", "tools", ToolSpec(tools, ToolChoice(ToolMode.AUTO, None, True)),
             ("I will look that up for you.\n" + call,)),
    ]


def all_cases() -> list[Case]:
    return [*SCHEMAS, *GBNF, *_tool_cases()]
