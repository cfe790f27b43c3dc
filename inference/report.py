"""The export's report as people read it (report.md, and the table the command prints): per format its route,
size, inputs, output, differences from the JAX model and the task's agreement and quality; then what was not checked
and which axes are fixed.
"""

from __future__ import annotations

from inference.inputs import shape_text

# What "agreement" and "quality" mean per task: (agreement's name, quality's name).
MEASURES = {
    "classification": ("top-1 agreement", "accuracy"),
    "sequence": ("top-1 agreement per position", "token accuracy"),
    "multilabel": ("sign agreement", "element accuracy"),
}


def fmt_size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def table(entries: list[dict], task: str) -> str:
    """The report as a Markdown table; the agreement and quality columns are the task's (none for regression). A
    model of several named outputs has one column of each output's figures, by its own task."""
    measures = MEASURES.get(task)
    named = any("outputs" in e for e in entries)
    head = ["format", "route", "size", "inputs", "outputs" if named else "output", "max abs diff", "max rel diff"]
    if named:
        measures = None
        head.append("per output")
    if measures:
        head += [measures[0], f"{measures[1]} (JAX)"]
    rows = []
    for e in entries:
        val = e.get("validation")
        diffs = [
            max(e["random"]["max_abs_diff"], val["max_abs_diff"] if val else 0.0),
            max(e["random"]["max_rel_diff"], val["max_rel_diff"] if val else 0.0),
        ]
        label = e["format"] + (f" ({e['quantize']})" if e.get("quantize") else "")
        row = [
            label,
            e["route"],
            fmt_size(e["bytes"]),
            ", ".join(f"{i['name']} {i['dtype']}{i['shape']}" for i in e["inputs"]),
            ", ".join(f"{o['name']} {o['shape']}" for o in e.get("outputs", [e.get("output")])),
            f"{diffs[0]:.1e}",
            f"{diffs[1]:.1e}",
        ]
        if named:
            row.append("; ".join(output_figures(o, e) for o in e["outputs"]))
        if measures:
            agree = val["agreement"] if val else e["random"]["agreement"]
            row.append(f"{100 * agree:.2f}%" + ("" if val else " (random inputs)"))
            row.append(
                f"{100 * val['quality']:.2f}% ({100 * val['jax_quality']:.2f}%)"
                if val and val["quality"] is not None
                else "-"
            )
        rows.append(row)
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def output_figures(output: dict, entry: dict) -> str:
    """One named output's figures in words: its largest difference, and its task's agreement and quality."""
    name, val = output["name"], entry.get("validation")
    figures = [entry["random"]["outputs"][name]] + ([val["outputs"][name]] if val else [])
    words = [f"{name} ({output['task']}): max abs diff {max(f['max_abs_diff'] for f in figures):.1e}"]
    measures = MEASURES.get(output["task"])
    if measures:
        shown = figures[-1]
        words.append(f"{measures[0]} {100 * shown['agreement']:.2f}%" + ("" if val else " (random inputs)"))
        if val and shown["quality"] is not None:
            words.append(f"{measures[1]} {100 * shown['quality']:.2f}% ({100 * shown['jax_quality']:.2f}% JAX)")
    return ", ".join(words)


def notes(report: dict) -> list[str]:
    """What the table alone does not say: what was not checked, and which axes are fixed."""
    lines = []
    if report["validation"] is None:
        lines.append(
            f"Not checked on real data ({report['validation_skipped']}): the formats were compared with "
            "the JAX model on random inputs only."
        )
    else:
        lines.append(
            f"Checked on {report['validation']['examples']} real examples of the "
            f"{report['validation']['split']} split, and on random inputs."
        )
    if "threshold" in report:  # multi-label outputs: where the agreement and the accuracy counted a label predicted
        lines.append(
            f"Labels count as predicted above probability {report['threshold']:g} (the config's decision threshold, "
            "as in test.py and predict.py; at 0.5 this is each logit's sign)."
        )
    fixed = ", ".join(f"{name} {shape_text(axes)}" for name, axes in report["fixed_axes"].items())
    lines.append(f"Only the batch axis can be symbolic (B); every other axis is fixed at the data's: {fixed}.")
    return lines


def markdown(report: dict) -> str:
    """report.md: the table, then its notes."""
    return table(report["formats"], report["task"]) + "\n\n" + "\n".join(notes(report)) + "\n"
