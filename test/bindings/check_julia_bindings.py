#!/usr/bin/env python3
"""Checks bindings/julia/MoeEp against the C headers, since Julia itself
cannot be installed where the tests run.

  - every ccall names a function the headers declare, with the same number
    of arguments, and argument and return types that match the prototype;
  - every Julia struct that mirrors a C struct has the C struct's fields, in
    order, with matching types;
  - the calls of a handle's life (REQUIRED: create, the fused and the split
    dispatch and combine, the async error query, the health poll and the
    active-rank mask, destroy, and the store and its bootstrap for
    failure_policy MASK) are all wrapped;
  - every `const NAME = Int32(n)` is the header's MOE_EP_NAME with value n
    (statuses, backends, phases, receive and scale layouts).

    check_julia_bindings.py MoeEp.jl HEADER...

It first checks itself: a copy of the Julia source with one argument
dropped, one argument type changed, one field type changed, one split
call replaced by the fused one (wrong argument 2, and the split call left
unwrapped) and one constant's value changed must be reported six times;
otherwise the check could not fail.
"""

import re
import sys

# C struct -> the Julia struct that mirrors it.
STRUCTS = {
    "moe_ep_device_t": "Device", "moe_ep_dtype_t": "DType", "moe_ep_tensor_t": "Tensor",
    "moe_ep_bootstrap_t": "Bootstrap", "moe_ep_params_t": "Params", "moe_ep_config_t": "Config",
    "moe_ep_dispatch_args_t": "DispatchArgs", "moe_ep_dispatch_result_t": "DispatchResult",
    "moe_ep_combine_result_t": "CombineResult", "moe_ep_health_t": "Health",
}
SCALARS = {
    "int32_t": "Int32", "moe_ep_status_t": "Int32", "uint32_t": "UInt32", "int64_t": "Int64",
    "uint64_t": "UInt64", "uint8_t": "UInt8", "uint16_t": "UInt16", "size_t": "Csize_t",
}
OPAQUE_POINTERS = {"moe_ep_handle_t", "moe_ep_store_t", "moe_ep_allgather_fn", "moe_ep_barrier_fn"}
# The calls of a handle's life, fused and split: the module must wrap each.
REQUIRED = {"moe_ep_create", "moe_ep_dispatch", "moe_ep_combine", "moe_ep_dispatch_send", "moe_ep_dispatch_recv",
            "moe_ep_combine_send", "moe_ep_combine_recv", "moe_ep_get_async_error", "moe_ep_health_init",
            "moe_ep_poll_health", "moe_ep_get_active_ranks", "moe_ep_set_active_ranks", "moe_ep_destroy",
            "moe_ep_store_serve", "moe_ep_store_port", "moe_ep_store_destroy", "moe_ep_bootstrap_from_store",
            "moe_ep_bootstrap_release"}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def c_type(decl, with_name=True):
    """'const moe_ep_params_t* params' -> ('moe_ep_params_t', 1)."""
    decl = decl.replace("*", " * ").replace("const", " ").split()
    if with_name and decl and decl[-1] != "*" and len(decl) > 1:
        decl = decl[:-1]
    stars = decl.count("*")
    base = " ".join(w for w in decl if w != "*")
    return base, stars


def julia_for_c(base, stars, in_struct):
    """The Julia types that faithfully pass a C type (several are fine: Ref
    and Ptr both pass a pointer; Ptr{Cvoid} passes any pointer, for the
    arguments that may be NULL)."""
    if base in OPAQUE_POINTERS:
        base, stars = "void", stars + 1
    if stars == 0:
        if base in SCALARS:
            return {SCALARS[base]}
        if base in STRUCTS:
            return {STRUCTS[base]}
        if base == "void":
            return {"Cvoid", "Nothing"}
        return set()
    inner = julia_for_c(base, stars - 1, in_struct)
    if base == "char" and stars == 1:
        inner = {"UInt8", "Cchar"}
        out = {"Cstring", "Ptr{UInt8}", "Ptr{Cchar}"}
    else:
        out = set()
    out |= {f"Ptr{{{t}}}" for t in inner}
    if not in_struct:
        out |= {f"Ref{{{t}}}" for t in inner} | {"Ptr{Cvoid}"}
    return out


def header_prototypes(texts):
    protos = {}
    for text in texts:
        for m in re.finditer(r"MOE_EP_API\s+([^;(]+?)\s*\b(moe_ep_\w+)\s*\(([^)]*)\)\s*;", strip_comments(text)):
            ret = c_type(m.group(1), with_name=False)
            args = [a.strip() for a in m.group(3).split(",") if a.strip() and a.strip() != "void"]
            protos[m.group(2)] = (ret, [c_type(a) for a in args])
    return protos


def header_structs(texts):
    structs = {}
    for text in texts:
        for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", strip_comments(text), re.S):
            fields = []
            for decl in m.group(2).split(";"):
                if decl.strip():
                    base, stars = c_type(decl)
                    fields.append((decl.replace("*", " ").split()[-1], base, stars))
            structs[m.group(3)] = fields
    return structs


def header_constants(texts):
    """MOE_EP_* enumerators and integer #defines -> value."""
    values = {}
    for text in texts:
        text = strip_comments(text)
        for m in re.finditer(r"\bMOE_EP_(\w+)\s*=\s*(-?\d+)\s*[,}\n]", text):
            values[m.group(1)] = int(m.group(2))
        for m in re.finditer(r"#define\s+MOE_EP_(\w+)\s+(-?\d+)\s*$", text, re.M):
            values[m.group(1)] = int(m.group(2))
    return values


def julia_constants(text):
    """(line, NAME, value) of every `const NAME = Int32(value)`."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1), int(m.group(2)))
            for m in re.finditer(r"^const\s+(\w+)\s*=\s*Int32\((-?\d+)\)", text, re.M)]


def split_top(s):
    """Split on commas outside braces and parentheses."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "{(":
            depth += 1
        elif ch in "})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def julia_ccalls(text):
    """(line, name, return type, [argument types]) of every ccall."""
    calls = []
    for m in re.finditer(r"ccall\(\(:(\w+),\s*\w+\)\s*,", text):
        line = text.count("\n", 0, m.start()) + 1
        rest = text[m.end():]
        ret, rest = rest.split(",", 1)
        rest = rest.lstrip()
        assert rest.startswith("("), f"MoeEp.jl:{line}: expected an argument type tuple"
        depth, end = 0, 0
        for i, ch in enumerate(rest):
            depth += ch in "({"
            depth -= ch in ")}"
            if depth == 0:
                end = i
                break
        args = [a for a in split_top(rest[1:end]) if a]
        calls.append((line, m.group(1), ret.strip(), args))
    return calls


def julia_structs(text):
    structs = {}
    for m in re.finditer(r"^(?:mutable\s+)?struct\s+(\w+)[^\n]*\n(.*?)^end", text, re.S | re.M):
        structs[m.group(1)] = re.findall(r"^\s*(\w+)::(\S+)", m.group(2), re.M)
    return structs


def problems(julia_text, header_texts):
    found = []
    protos = header_prototypes(header_texts)
    for line, name, ret, args in julia_ccalls(julia_text):
        where = f"MoeEp.jl:{line}: {name}"
        if name not in protos:
            found.append(f"{where}: not declared in the headers")
            continue
        (rbase, rstars), cargs = protos[name]
        if ret not in julia_for_c(rbase, rstars, False) - {"Ptr{Cvoid}"} | ({"Cstring"} if rbase == "char" else set()):
            found.append(f"{where}: returns {ret}, the header says {rbase}{'*' * rstars}")
        if len(args) != len(cargs):
            found.append(f"{where}: {len(args)} arguments, the header has {len(cargs)}")
            continue
        for i, (jt, (base, stars)) in enumerate(zip(args, cargs)):
            if jt not in julia_for_c(base, stars, False):
                found.append(f"{where}: argument {i + 1} is {jt}, the header says {base}{'*' * stars}")
    wrapped = {name for _, name, _, _ in julia_ccalls(julia_text)}
    for name in sorted(REQUIRED - wrapped):
        found.append(f"MoeEp.jl: no ccall of {name}" + ("" if name in protos else " (nor in the headers)"))
    constants = header_constants(header_texts)
    for line, name, value in julia_constants(julia_text):
        if name not in constants:
            found.append(f"MoeEp.jl:{line}: const {name} has no MOE_EP_{name} in the headers")
        elif constants[name] != value:
            found.append(f"MoeEp.jl:{line}: const {name} = {value}, the header's MOE_EP_{name} is {constants[name]}")
    jstructs = julia_structs(julia_text)
    for cname, fields in header_structs(header_texts).items():
        jname = STRUCTS.get(cname)
        if jname is None:
            continue
        if jname not in jstructs:
            found.append(f"MoeEp.jl: no struct {jname} for {cname}")
            continue
        jfields = jstructs[jname]
        if [f for f, _ in jfields] != [f for f, _, _ in fields]:
            found.append(f"MoeEp.jl: {jname} fields {[f for f, _ in jfields]} differ from {cname}'s "
                         f"{[f for f, _, _ in fields]}")
            continue
        for (fname, jt), (_, base, stars) in zip(jfields, fields):
            if jt not in julia_for_c(base, stars, True):
                found.append(f"MoeEp.jl: {jname}.{fname} is {jt}, {cname} has {base}{'*' * stars}")
    return found, protos


def self_test(julia_text, header_texts):
    """Five planted mistakes must give six reports."""
    broken = julia_text.replace("(Ref{Int32}, Ref{Int32}, Ref{Int32})", "(Ref{Int32}, Ref{Int32})", 1)
    broken = broken.replace("(:moe_ep_get_async_error, libmoe_ep), Int32, (Ptr{Cvoid}, Ref{Int32})",
                            "(:moe_ep_get_async_error, libmoe_ep), Int32, (Ptr{Cvoid}, Ref{Int64})", 1)
    broken = broken.replace("    top_k::Int32\n", "    top_k::Int64\n", 1)
    broken = broken.replace("(:moe_ep_combine_recv, libmoe_ep)", "(:moe_ep_combine, libmoe_ep)")
    broken = broken.replace("const LAYOUT_EXPERT_PACKED = Int32(2)", "const LAYOUT_EXPERT_PACKED = Int32(3)", 1)
    assert broken.count("\n") == julia_text.count("\n")
    found, _ = problems(broken, header_texts)
    if (len(found) != 6 or not any("no ccall of moe_ep_combine_recv" in f for f in found)
            or not any("LAYOUT_EXPERT_PACKED = 3" in f for f in found)):
        print("FAIL: the checker's self-test expected 6 reports on planted mistakes, got:")
        print("\n".join(found) or "(none)")
        return False
    return True


def main():
    julia_path, headers = sys.argv[1], sys.argv[2:]
    julia_text = open(julia_path).read()
    header_texts = [open(h).read() for h in headers]
    if not self_test(julia_text, header_texts):
        return 1
    found, protos = problems(julia_text, header_texts)
    calls = julia_ccalls(julia_text)
    print(f"{len(calls)} ccalls, {len(julia_structs(julia_text))} structs and "
          f"{len(julia_constants(julia_text))} constants checked against {len(protos)} prototypes")
    unbound = sorted(set(protos) - {c[1] for c in calls})
    if unbound:
        print("not wrapped in Julia (fine, for information):", ", ".join(unbound))
    if found:
        print("\n".join(found))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
