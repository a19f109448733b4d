"""kvq.parse_spec against the spec grammar (core/spec.h): canonical names and fields."""
import pytest

import kvq


@pytest.mark.parametrize("text,canonical", [
    ("kivi2", "kivi2:g=32,r=128"),  # kivi<B> defaults: g=32, r=128 (REFERENCE.md section 3)
    ("kivi4:g=32,r=64", "kivi4:g=32,r=64"),
    ("fp8", "fp8_e4m3:gran=tensor,scale=dynamic"),  # the alias
    ("fp8_e5m2:gran=token", "fp8_e5m2:gran=token,scale=dynamic"),
    ("bf16", "bf16"),
])
def test_canonical(text, canonical):
    s = kvq.parse_spec(text)
    assert s.canonical == canonical
    assert str(s) == canonical
    assert kvq.parse_spec(s) == s  # a Spec is accepted wherever a spec string is


def test_int_fields():
    s = kvq.parse_spec("int3:k=token,v=channel,g=32,r=64,sym")
    assert (s.kind, s.bits, s.key_axis, s.value_axis, s.group, s.residual, s.sym) == (
        "int", 3, "token", "channel", 32, 64, True)
    assert s.arith == "exact"
    assert s.format is None


def test_kivi_arithmetic_option():
    s = kvq.parse_spec("kivi2:arith=fp16")
    assert (s.canonical, s.arith) == ("kivi2:g=32,r=128,arith=fp16", "fp16")
    with pytest.raises(kvq.Error, match="arith=fp16 is KIVI's asymmetric"):
        kvq.parse_spec("kivi2:sym,arith=fp16")


def test_split_spec_has_both_sides():
    s = kvq.parse_spec("k=kivi2,v=fp8_e4m3:gran=token")
    assert s.kind == "split"
    assert s.canonical == "k=kivi2:g=32,r=128;v=fp8_e4m3:gran=token,scale=dynamic"
    assert (s.key.kind, s.key.bits, s.value.kind, s.value.gran) == ("int", 2, "fp8", "token")


def test_fp8_fields():
    s = kvq.parse_spec("fp8_e4m3:gran=channel,scale=2.5")
    assert (s.kind, s.format, s.gran, s.scale) == ("fp8", "fp8_e4m3", "channel", "constant")
    assert s.fields["scale_value"] == 2.5


@pytest.mark.parametrize("text,part", [("kivi5", "5 bits"), ("fp8_e4m3:gran=row", "row"),
                                       ("", "")])
def test_bad_spec_is_a_value_error(text, part):
    with pytest.raises(kvq.Error) as e:
        kvq.parse_spec(text)
    assert isinstance(e.value, ValueError)
    assert part in str(e.value) and "\n" not in str(e.value)


def test_not_a_string():
    with pytest.raises(kvq.Error, match="expected a spec string"):
        kvq.parse_spec(3)


def test_rotation_and_sinks():
    # Issue 15: rot=hadamard[:SEED] and sink=S on any scheme; absent when not given.
    s = kvq.parse_spec("kivi2:rot=hadamard:7,sink=4")
    assert s.canonical == "kivi2:g=32,r=128,rot=hadamard:7,sink=4"
    assert (s.rot, s.sink) == ("hadamard:7", 4)
    assert kvq.parse_spec("bf16:rot=hadamard").rot == "hadamard"
    assert kvq.parse_spec("kivi2").rot is None and kvq.parse_spec("kivi2").sink is None
    assert kvq.parse_spec("kivi2@0-1=kivi4").canonical == "kivi2:g=32,r=128@0-1=kivi4:g=32,r=128"
    # Issue 49 item 5: the layer preset stays in the name, explicit overrides after it.
    assert (kvq.parse_spec("kivi2@0=kivi4@last=2,first=2").canonical ==
            "kivi2:g=32,r=128@first=2,last=2@0=kivi4:g=32,r=128")
