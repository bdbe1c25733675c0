"""What `bundlegen calibrate --write` puts into a plan file: `write_coefficients` edits, in
place, only the number literals of one COST_MODEL entry (adding the entry, or the fields it
lacks), and `write_measured` the class's COST_MEASURED row; every other byte stays."""
from __future__ import annotations

import ast
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Sequence

from bundlegen.cost import CostCoefficients, Measured
from bundlegen import safe_write
from bundlegen.generator.calibrate import WRITTEN, CalibrationError, LevelError, format_number


def literal(field: str, coeffs: CostCoefficients) -> str:
    """The text --write puts for one field: runs as integers, the rest format_number."""
    value = getattr(coeffs, field)
    return str(int(value)) if field.endswith("_runs") else format_number(value)


def coefficient_block(device_class: str, coeffs: CostCoefficients, indent: int = 4) -> str:
    """The COST_MODEL entry as it would be pasted into the plan."""
    head = " " * indent + f'"{device_class}": CostCoefficients('
    parts = [f"{f}={literal(f, coeffs)}" for f in WRITTEN]
    pad = " " * len(head)
    lines = [", ".join(parts[i:i + 3]) for i in range(0, len(parts), 3)]
    return head + (",\n" + pad).join(lines) + "),"


@dataclass(frozen=True)
class Edit:
    field: str
    old: str
    new: str


def _cost_model_dict(tree: ast.Module) -> ast.Dict:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "COST_MODEL" for t in targets):
            if not isinstance(node.value, ast.Dict):
                raise CalibrationError("COST_MODEL is not a dict literal")
            return node.value
    raise CalibrationError("no COST_MODEL assignment at the plan's top level")


def _offset(data: bytes, line: int, col: int) -> int:
    """The byte offset of an ast (line, UTF-8 column) position."""
    return sum(len(x) for x in data.splitlines(keepends=True)[:line - 1]) + col


def with_entry(data: bytes, device_class: str, coeffs: CostCoefficients) -> bytes:
    """The plan text with COST_MODEL[device_class] present and setting every WRITTEN field:
    a missing entry is added before the dict's closing brace (coefficient_block), a missing
    field as a keyword before its call's closing parenthesis; the rest is left as it was."""
    table = _cost_model_dict(ast.parse(data))
    for key, value in zip(table.keys, table.values):
        if isinstance(key, ast.Constant) and key.value == device_class:
            if not isinstance(value, ast.Call):
                raise CalibrationError(f"COST_MODEL[{device_class!r}] is not a call")
            missing = [f for f in WRITTEN if f not in _fields_set(data, device_class)]
            if not missing:
                return data
            close = _offset(data, value.end_lineno, value.end_col_offset) - 1   # its ")"
            first = (value.args or [kw.value for kw in value.keywords])[0]
            pad = " " * (first.col_offset - (len(first.__class__.__name__) * 0)
                         - (0 if value.args else len(value.keywords[0].arg) + 1))
            parts = [f"{f}={literal(f, coeffs)}" for f in missing]
            lines = [", ".join(parts[i:i + 3]) for i in range(0, len(parts), 3)]
            added = "".join(f",\n{pad}{line}" for line in lines)
            return data[:close].rstrip() + added.encode() + data[close:]
    close = _offset(data, table.end_lineno, table.end_col_offset) - 1            # the dict's "}"
    before = data[:close].rstrip()
    comma = b"" if before.endswith((b",", b"{")) else b","
    return before + comma + b"\n" + coefficient_block(device_class, coeffs).encode() + b"\n" + data[close:]


def _fields_set(data: bytes, device_class: str) -> set[str]:
    """The fields COST_MODEL[device_class] sets in the plan text (none: no such entry)."""
    table = _cost_model_dict(ast.parse(data))
    for key, value in zip(table.keys, table.values):
        if isinstance(key, ast.Constant) and key.value == device_class and isinstance(value, ast.Call):
            return {kw.arg for kw in value.keywords} | {f.name for f in fields(CostCoefficients)[:len(value.args)]}
    return set()


def _entry_call(tree: ast.Module, device_class: str) -> ast.Call:
    table = _cost_model_dict(tree)
    for key, value in zip(table.keys, table.values):
        if isinstance(key, ast.Constant) and key.value == device_class:
            if not isinstance(value, ast.Call):
                raise CalibrationError(f"COST_MODEL[{device_class!r}] is not a call")
            return value
    raise CalibrationError(f"COST_MODEL has no entry {device_class!r}")


def _literal_nodes(call: ast.Call) -> dict[str, ast.Constant]:
    """Field name -> the number literal that sets it (keyword or positional)."""
    names = [f.name for f in fields(CostCoefficients)]
    found = {names[i]: arg for i, arg in enumerate(call.args)}
    found.update({kw.arg: kw.value for kw in call.keywords if kw.arg})
    out = {}
    for name in WRITTEN:
        node = found.get(name)
        if node is None:
            raise CalibrationError(f"the entry does not set {name}")
        if not (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
                and not isinstance(node.value, bool)):
            raise CalibrationError(f"{name} is not a number literal; edit it by hand")
        out[name] = node
    return out


def write_coefficients(plan_path: Path | str, device_class: str, coeffs: CostCoefficients) -> list[Edit]:
    """Replace the number literals of COST_MODEL[device_class]'s fitted fields in the plan
    file, leaving every other byte as it was. Returns the edits made."""
    path = Path(plan_path)
    original = path.read_bytes()
    data = with_entry(original, device_class, coeffs)
    absent = set(WRITTEN) - _fields_set(original, device_class)   # what with_entry added
    call = _entry_call(ast.parse(data), device_class)
    nodes = _literal_nodes(call)
    # ast offsets are UTF-8 byte columns, so the edit works on bytes
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans = []
    for name, node in nodes.items():
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        spans.append((begin, end, name))
    edits, out = [], data
    for begin, end, name in sorted(spans, reverse=True):
        new = literal(name, coeffs)
        edits.append(Edit(name, "absent" if name in absent else data[begin:end].decode(), new))
        out = out[:begin] + new.encode() + out[end:]
    written = _literal_nodes(_entry_call(ast.parse(out), device_class))
    for name in WRITTEN:
        if float(written[name].value) != float(literal(name, coeffs)):
            raise CalibrationError(f"rewrite check failed for {name}")  # the file is not written
    if out != original:
        safe_write.write_bytes(path, out)   # the caller checked it lies in the workspace
    return sorted(edits, key=lambda e: WRITTEN.index(e.field))


def measured_of(rows: Sequence[LevelError], source: str) -> Measured:
    return Measured(source=source, levels=tuple((r.level, r.cases, round(r.measured_s, 2), round(r.after_s, 2))
                                                for r in rows if r.level != "total"))


def measured_entry(device_class: str, measured: Measured, indent: int = 4) -> str:
    """The COST_MEASURED entry as --write puts it into the plan."""
    pad = " " * (indent + 4)
    levels = f",\n{pad} ".join(f"({name!r}, {cases}, {seconds:g}, {predicted:g})"
                              for name, cases, seconds, predicted in measured.levels)
    return (" " * indent + f"{device_class!r}: Measured(\n{pad}{measured.source!r},\n"
            f"{pad}({levels}{',' if len(measured.levels) == 1 else ''})),").replace("'", '"')


def write_measured(plan_path: Path | str, device_class: str, measured: Measured) -> bool:
    """Put COST_MEASURED[device_class] into the plan file (replacing the entry, or adding it
    before the dict's closing brace); False where the plan has no COST_MEASURED dict."""
    path = Path(plan_path)
    data = path.read_bytes()
    table = next((node.value for node in ast.parse(data).body if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "COST_MEASURED" for t in node.targets)), None)
    if not isinstance(table, ast.Dict):
        return False
    text = measured_entry(device_class, measured).encode()
    for key, value in zip(table.keys, table.values):
        if isinstance(key, ast.Constant) and key.value == device_class:
            line_start = _offset(data, key.lineno, 0)
            end = _offset(data, value.end_lineno, value.end_col_offset)
            end += 1 if data[end:end + 1] == b"," else 0
            out = data[:line_start] + text + data[end:]
            break
    else:
        close = _offset(data, table.end_lineno, table.end_col_offset) - 1
        before = data[:close].rstrip()
        comma = b"" if before.endswith((b",", b"{")) else b","
        out = before + comma + b"\n" + text + b"\n" + data[close:]
    safe_write.write_bytes(path, out)
    return True
