"""The tables of ``docs/methods.md`` that list the families, generated from :data:`METHODS`.

The page keeps the text; the tables between ``<!-- families:start -->`` and
``<!-- families:end -->`` (and the old names between ``<!-- aliases:… -->``) are written by
``python -m sparsefinder.methods.docs_table docs/methods.md`` and checked by a test, so a new
family is in the docs by being registered (the way transformers checks its model tables).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from sparsefinder.methods.registry import METHODS, Param, method_id

READS = {"projected": "projections", "original": "original q/k", "shape": "shapes"}


def _param(param: Param) -> str:
    return f"`{param.name}` ({param.describe()}; link `{param.url}`)"


def families_table() -> str:
    """One row per registered family: name, parameters, calibrations, sweep curves, reads."""
    rows = ["| family | what | parameters | calibrations | sweep curves | reads |",
            "|---|---|---|---|---|---|"]
    for name, method in METHODS.items():
        params = ", ".join(_param(p) for p in method.params) or "none"
        reads = READS[method.inputs] + (", fitted on train graphs" if method.fit else "")
        for form in method.forms:
            reads += (f"; `{form.param}={form.value}`: {READS[form.inputs]}"
                      + (", fitted on train graphs" if form.fit else ""))
        tagged = [", ".join(method.tags)] if method.tags else []
        tagged += [f"`{form.param}={form.value}`: {', '.join(form.tags)}"
                   for form in method.forms if form.tags]
        tags = f" ({'; '.join(tagged)})" if tagged else ""
        curves = ", ".join(f"`{g.name}`" for g in method.curves) or "none"
        rows.append(f"| `{name}` | {method.label}{tags} | {params} | "
                    f"{', '.join(method.calibration_names)} | {curves} | {reads} |")
    return "\n".join(rows)


def aliases_table() -> str:
    """The names of the time before calibration (or a form of a family) was a parameter, with
    their new spelling."""
    rows = ["| old name | family and calibration |", "|---|---|"]
    for old, new in METHODS.aliases().items():
        form = "".join(f", `{k}={v!r}`" for k, v in METHODS.alias_params.get(old, {}).items())
        rows.append(f"| `{old}` | `{method_id(*new)}`{form} |")
    return "\n".join(rows)


TABLES = {"families": families_table, "aliases": aliases_table}


def render(page: str) -> str:
    """``page`` with every generated table written anew between its markers."""
    for key, make in TABLES.items():
        pattern = re.compile(rf"(<!-- {key}:start -->\n).*?(<!-- {key}:end -->)", re.S)
        if not pattern.search(page):
            raise ValueError(f"the page has no <!-- {key}:start --> … <!-- {key}:end --> block")
        page = pattern.sub(lambda m, make=make: m.group(1) + make() + "\n" + m.group(2), page)
    return page


def main(argv: list[str] | None = None) -> int:
    """Rewrite the tables of the page given (default ``docs/methods.md``)."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0] if args else "docs/methods.md")
    path.write_text(render(path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
