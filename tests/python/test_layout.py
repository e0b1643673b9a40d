"""The ctypes mirrors of relaymoe._capi against the installed relaymoe.h, as
the C compiler lays it out (struct_layout.py): every field's offset, size
and kind, every struct's size, every enum value. And the check itself: a
header that gained a field in padding, or widened one, is caught."""
import os

import struct_layout

INCLUDE = os.path.join(os.environ["RELAYMOE_PREFIX"], "include")  # set by run.sh
CC = os.environ.get("CC", "cc")


def test_python_mirrors_match_the_header():
    diff = struct_layout.differences(struct_layout.c_layout(INCLUDE, CC), struct_layout.python_layout(),
                                     "relaymoe._capi")
    assert not diff, "\n".join(diff)


def test_drift_is_caught(tmp_path):
    header = open(os.path.join(INCLUDE, "relaymoe", "relaymoe.h")).read()
    # An int added where padding hides it from sizeof, and a widened field.
    changed = header.replace("\tint check_finite;", "\tint check_finite;\n\tint added_flag;", 1)
    changed = changed.replace("\tint hops;", "\tint64_t hops;", 1)
    assert changed.count("added_flag") == 1 and "int64_t hops;" in changed
    (tmp_path / "relaymoe").mkdir()
    (tmp_path / "relaymoe" / "relaymoe.h").write_text(changed)
    diff = struct_layout.differences(struct_layout.c_layout(str(tmp_path), CC), struct_layout.python_layout(),
                                     "relaymoe._capi")
    assert any("added_flag" in d and "lacks" in d for d in diff), diff
    assert any("rmoe_layer_stats.hops" in d for d in diff), diff
