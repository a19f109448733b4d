"""kvq.schemes(): the scheme registry (core/schemes.h) from Python.

Checked against the C++ registry as the CLI prints it (`kvq quant --help`'s scheme list, another
binary of the same checkout) and against the parser: every example parses to itself, every
declared default parses as the bare name, every flag changes the spec, every alias parses.
"""
import pytest

import kvq


@pytest.fixture(scope="module")
def families():
    return kvq.schemes()


@pytest.fixture(scope="module")
def quant_help(cli):
    return cli("quant", "--help").stdout


def test_lists_the_families_in_the_clis_order(families, quant_help):
    assert [f["family"] for f in families] == ["float", "fp8", "int"]
    at = [quant_help.find(f"  {f['names']}\n") for f in families]
    assert all(i >= 0 for i in at), quant_help
    assert at == sorted(at)  # --help lists them in registry order


def test_help_lines_are_the_clis(families, quant_help):
    for f in families:
        assert f"      {f['keys_help']}\n      {f['description']}\n" in quant_help, f["family"]
        for a in f["aliases"]:
            if a["rewrite"]:
                assert f"      {a['name']}: {a['means']}\n" in quant_help, a["name"]


def test_examples_are_canonical(families):
    for f in families:
        assert f["examples"], f["family"]
        for e in f["examples"]:
            s = kvq.parse_spec(e)
            assert s.canonical == e
            assert kvq.parse_spec(s.canonical) == s
            assert s.kind in f["kinds"] + [f["family"]], e  # int's kind label is "int/kivi"


def test_kivi_keys_by_definition(families):
    # kivi<B>: g=32, r=128 (REFERENCE.md section 3), asymmetric, kvq's exact arithmetic.
    (int_family,) = [f for f in families if f["family"] == "int"]
    assert int_family["keys"]["kivi2"] == {"g": "32", "r": "128", "sym": False, "arith": "exact"}
    assert int_family["keys"]["int4"]["r"] == "0"


def test_defaults_parse_as_the_bare_name(families):
    for f in families:
        assert set(f["keys"]) == {e.split(":")[0] for e in f["examples"]}
        for name, keys in f["keys"].items():
            bare = kvq.parse_spec(name).canonical
            written = ",".join(f"{k}={v}" for k, v in keys.items() if v is not False)
            if written:
                assert kvq.parse_spec(f"{name}:{written}").canonical == bare, name
            for flag in (k for k, v in keys.items() if v is False):
                spec = f"{name}:{written},{flag}" if written else f"{name}:{flag}"
                assert kvq.parse_spec(spec).canonical != bare, spec


def test_aliases_parse(families):
    for f in families:
        for a in f["aliases"]:
            s = kvq.parse_spec(a["name"])
            assert s.kind in f["kinds"] + [f["family"]]
            if not a["rewrite"]:  # a plain alias is another name of `means`
                assert s == kvq.parse_spec(a["means"])
