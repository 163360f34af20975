"""Config dataclasses declare their per-field checks (``cliffguard.core.declared``) rather than
writing them by hand, and every one that declares a check runs them (read with ``ast``).

A *plain single-field check* is a top-level statement of a dataclass's ``__post_init__``::

    if <test>: raise ValueError("<field>: <reason>")

(or the same inside ``for name in ("a", "b"): ... getattr(self, name) ...``) whose test reads one
field of ``self`` and nothing else that varies — no other field, no local variable, no call, no
arithmetic — and whose message is fixed text starting with that field's name. Such a check is a
``bounded``/``one_of``/``non_empty`` declaration on the field. Checks that relate two fields
(``a <= b``), compute something (``a % b``, ``len(name)``), or word the message with the value or
another name stay hand-written.
"""

from __future__ import annotations

import ast

from tests.test_import_graph import MODULES

DECLARATIONS = {"bounded", "one_of", "non_empty"}


def _is_dataclass(cls: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(d) for d in cls.decorator_list)


def _post_init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__post_init__"), None)


def _field_read(test: ast.expr, loop_names: tuple[str, ...], local: set[str]) -> set[str] | None:
    """The fields ``test`` reads when it reads nothing else that varies; None otherwise."""
    fields: set[str] = set()
    for node in ast.walk(test):
        if isinstance(node, ast.Call):
            if not (loop_names and ast.unparse(node) == "getattr(self, name)"):
                return None
            fields.update(loop_names)
        elif isinstance(node, ast.BinOp):
            return None
        elif isinstance(node, ast.Attribute):
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                return None
            fields.add(node.attr)
        elif isinstance(node, ast.Name) and node.id in local:
            return None
    return fields


def _message(exc: ast.expr | None) -> ast.expr | None:
    if isinstance(exc, ast.Call) and ast.unparse(exc.func) == "ValueError" and len(exc.args) == 1:
        return exc.args[0]
    return None


def plain_checks(tree: ast.Module) -> list[str]:
    """``Class.field`` for every plain single-field check written by hand in ``tree``."""
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and _is_dataclass(n)):
        post = _post_init(cls)
        if post is None:
            continue
        local = {n.id for n in ast.walk(post) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for stmt in post.body:
            loop_names: tuple[str, ...] = ()
            if (isinstance(stmt, ast.For) and ast.unparse(stmt.target) == "name" and isinstance(stmt.iter, ast.Tuple)
                    and len(stmt.body) == 1):
                loop_names = tuple(e.value for e in stmt.iter.elts if isinstance(e, ast.Constant))
                stmt = stmt.body[0]
            if not (isinstance(stmt, ast.If) and len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Raise)):
                continue
            msg = _message(stmt.body[0].exc)
            fields = _field_read(stmt.test, loop_names, local - {"name"} if loop_names else local)
            if msg is None or not fields or (len(fields) != 1 and not loop_names):
                continue
            if any(isinstance(n, ast.Name) and n.id == "self" for n in ast.walk(msg)):
                continue  # the message shows the value: worded by hand
            text = ast.unparse(msg)
            heads = [f"{f}: " for f in fields] if not loop_names else ["{name}: "]
            if any(h in text for h in heads):
                found.append(f"{cls.name}.{'/'.join(sorted(fields))}")
    return found


def test_no_config_dataclass_hand_writes_a_plain_single_field_check():
    found = {name: plain_checks(ast.parse(path.read_text())) for name, path in MODULES.items()
             if not name.startswith(("tests", "bench"))}
    assert {name: checks for name, checks in found.items() if checks} == {}


def test_the_scan_finds_a_hand_written_check():
    tree = ast.parse('''
@dataclass
class C:
    window: int = 8
    def __post_init__(self):
        if self.window < 8:
            raise ValueError("window: must be >= 8")
        for name in ("a", "b"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0")
        if self.lo > self.hi:
            raise ValueError("lo: must be <= hi")
''')
    assert plain_checks(tree) == ["C.window", "C.a/b"]


def test_every_dataclass_that_declares_a_check_runs_them():
    missing = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and _is_dataclass(n)):
            declares = any(isinstance(s, ast.AnnAssign) and isinstance(s.value, ast.Call)
                           and ast.unparse(s.value.func) in DECLARATIONS for s in cls.body)
            post = _post_init(cls)
            runs = post is not None and any(isinstance(n, ast.Call) and ast.unparse(n.func) == "check_declared"
                                            for n in ast.walk(post))
            if declares and not runs:
                missing.append(f"{name}.{cls.name}")
    assert missing == []
