#!/usr/bin/python3
"""The layout of the public structs and the values of the public enums, read
from the installed relaymoe.h by the C compiler, to compare with the Python
(ctypes) and Fortran (bind(c)) mirrors.

Every `struct rmoe_* { ... };` and `enum rmoe_* { ... };` of the header is
parsed (comments stripped; one field per declarator), and a C program
generated from them prints, per field, its offset, size and kind (int,
float or ptr, by _Generic), and per struct its size. A field added to the
header appears here by itself, so a mirror that lacks it fails.

Lines:  struct NAME size N
        field NAME.FIELD offset O size S kind K
        enum NAME VALUE

  struct_layout.py c INCLUDE_DIR [CC]     the header's layout, from the compiler
  struct_layout.py compare C_FILE OTHER_FILE NAME   exit 1 listing the differences
                                          of the mirror NAME printed in OTHER_FILE
"""
import os
import re
import subprocess
import sys
import tempfile


def parse_header(path):
    """{struct: [field, ...]} and [enum constant, ...] of the header."""
    text = open(path).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    structs = {}
    for name, body in re.findall(r"struct\s+(rmoe_\w+)\s*\{(.*?)\}\s*;", text, flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = decl.strip()
            if not decl:
                continue
            # "const char *a, *b" -> a, b; "int x[4]" -> x
            parts = decl.split(",")
            first = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", parts[0]).group(1)
            fields.append(first)
            for p in parts[1:]:
                fields.append(re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", p).group(1))
        structs[name] = fields
    enums = []
    for body in re.findall(r"enum\s+rmoe_\w+\s*\{(.*?)\}\s*;", text, flags=re.S):
        for item in body.split(","):
            m = re.match(r"\s*(RMOE_\w+)", item)
            if m:
                enums.append(m.group(1))
    return structs, enums


def c_program(structs, enums):
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <relaymoe/relaymoe.h>",
             '#define KIND(v) _Generic((v), char *: "ptr", const char *: "ptr", void *: "ptr", '
             'double: "float", float: "float", default: "int")',
             "int main(void)", "{"]
    for s, fields in structs.items():
        lines.append(f'\tprintf("struct {s} size %zu\\n", sizeof(struct {s}));')
        for f in fields:
            lines.append(f'\t{{ struct {s} v; (void)v; printf("field {s}.{f} offset %zu size %zu kind %s\\n", '
                         f'offsetof(struct {s}, {f}), sizeof(v.{f}), KIND(v.{f})); }}')
    for e in enums:
        lines.append(f'\tprintf("enum {e} %d\\n", (int){e});')
    lines += ["\treturn 0;", "}"]
    return "\n".join(lines) + "\n"


def c_layout(include_dir, cc="cc"):
    """The header's layout lines, compiled and run."""
    structs, enums = parse_header(os.path.join(include_dir, "relaymoe", "relaymoe.h"))
    if not structs:
        raise RuntimeError(f"no struct rmoe_* found in {include_dir}/relaymoe/relaymoe.h")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
        with open(src, "w") as f:
            f.write(c_program(structs, enums))
        subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", include_dir, src, "-o", exe], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    return sorted(out.splitlines())


def python_layout():
    """The same lines from the ctypes mirrors of relaymoe._capi."""
    import ctypes

    from relaymoe import _capi
    kinds = {ctypes.c_int: "int", ctypes.c_int64: "int", ctypes.c_double: "float", ctypes.c_char_p: "ptr",
             ctypes.c_void_p: "ptr"}
    lines = []
    for s, mirror in _capi.MIRRORS.items():
        lines.append(f"struct {s} size {ctypes.sizeof(mirror)}")
        for name, ctype in mirror._fields_:
            d = getattr(mirror, name)
            lines.append(f"field {s}.{name} offset {d.offset} size {d.size} kind {kinds[ctype]}")
    for name, value in _capi.ENUMS.items():
        lines.append(f"enum {name} {value}")
    return sorted(lines)


def differences(c_lines, other_lines, what):
    """Sentences naming each difference of other_lines from c_lines."""
    def key(line):
        w = line.split()
        return " ".join(w[:2])

    c = {key(l): l for l in c_lines}
    o = {key(l): l for l in other_lines}
    out = []
    for k in sorted(c.keys() | o.keys()):
        if k not in o:
            out.append(f"{what} lacks `{c[k]}` of relaymoe.h")
        elif k not in c:
            out.append(f"{what} has `{o[k]}`, which relaymoe.h does not")
        elif c[k] != o[k]:
            out.append(f"relaymoe.h has `{c[k]}`, {what} `{o[k]}`")
    return out


def main(argv):
    if len(argv) >= 2 and argv[0] == "c":
        print("\n".join(c_layout(argv[1], argv[2] if len(argv) > 2 else "cc")))
        return 0
    if len(argv) == 4 and argv[0] == "compare":
        c_lines = open(argv[1]).read().split("\n")
        other = open(argv[2]).read().split("\n")
        diff = differences([l.strip() for l in c_lines if l.strip()], [l.strip() for l in other if l.strip()],
                           argv[3])
        for d in diff:
            print(d)
        print(f"{argv[3]}: {'matches relaymoe.h' if not diff else f'{len(diff)} difference(s) from relaymoe.h'}")
        return 1 if diff else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
