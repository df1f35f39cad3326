"""One owner per fact (issue 20): checks over the source of `headprobe/` itself.

- no function longer than 60 lines, no module longer than 600, and no two modules with one file name
  (an analysis folder's `analysis.py` and `report.py` are named by their folder);
- percentile intervals computed only in `headprobe/stats/estimates.py`;
- an analysis's name spelled (as a string) only in its own module: the generic code reads
  names from the registry. A role's name (`RoleRule.role`, METHODS §6) is a fact of its own, spelled
  where that rule is made; the registry's input kinds (`registry.INPUTS`) are spelled in the registry.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from headprobe.scoring import registry

PACKAGE = Path(__file__).resolve().parents[1] / "headprobe"
MAX_LINES = 60


def sources() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))}


def test_no_function_longer_than_60_lines():
    long = []
    for path, text in sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(
                        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)"
                    )
    assert not long, f"functions longer than {MAX_LINES} lines:\n" + "\n".join(long)


SUFFIXES = (
    "s",
    "es",
    "er",
    "ers",
    "ing",
    "ed",
    "_",
)  # scorer/scorers, scoring/scorers, check/checks


def stem(name: str) -> str:
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix) and len(name) - len(suffix) >= 3:
            return name[: -len(suffix)]
    return name


def test_no_two_names_differ_only_by_a_suffix():
    """Folder and module names of the package: none is another's plus (or minus) a suffix such as
    -s or -ing (`scorers/` beside `scoring/`, `check.py` beside `checks.py`); the same name in two
    places (an analysis's `report.py` and `report/`) is one name, not two."""
    names = {p.stem for p in PACKAGE.rglob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    by_stem: dict[str, set[str]] = {}
    for name in names:
        by_stem.setdefault(stem(name), set()).add(name)
    clashes = sorted(sorted(group) for group in by_stem.values() if len(group) > 1)
    assert not clashes, f"names that differ only by a suffix: {clashes}"


def test_the_suffix_rule_catches_the_old_names():
    assert stem("scorers") == stem("scoring") == stem("scorer")
    assert stem("check") == stem("checks")
    assert stem("core") != stem("corefud")


def test_percentiles_only_in_stats():
    pattern = re.compile(r"np\.(nan)?(percentile|quantile)")
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{i}"
        for path, text in sources().items()
        if path != PACKAGE / "stats" / "estimates.py"
        for i, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "percentiles computed outside headprobe/stats/estimates.py: " + ", ".join(
        found
    )


def string_constants(text: str) -> set[str]:
    """Every string literal of a module, docstrings excluded."""
    tree = ast.parse(text)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    }


def homes(analysis) -> set[Path]:
    """An analysis's own modules: every module of its folder (`headprobe/studies/<analysis>/`),
    its report section's where it names one, and the others it declares (`Analysis.homes`)."""
    modules = {analysis.scorer.__module__, *analysis.homes}
    if isinstance(analysis.report, str):
        modules.add(analysis.report.partition(":")[0])
    paths = {(PACKAGE.parent / (m.replace(".", "/") + ".py")).resolve() for m in modules}
    studies = (PACKAGE / "studies").resolve()
    folders = {p.parent for p in paths if p.parent.parent == studies}
    return paths | {p.resolve() for folder in folders for p in folder.glob("*.py")}


def roles_made(text: str) -> set[str]:
    """The role names a module makes rules of: the literal first argument (or `role=`) of each
    `RoleRule(...)` call in it."""
    made = set()
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "RoleRule"
        ):
            role = (
                node.args[0]
                if node.args
                else next((k.value for k in node.keywords if k.arg == "role"), None)
            )
            if isinstance(role, ast.Constant) and isinstance(role.value, str):
                made.add(role.value)
    return made


def test_roles_made_reads_rule_calls():
    source = (
        'R = RoleRule("sink", 4, "#888", "d", f)\nS = registry.RoleRule(role="broad", order=5)\n'
        'T = RoleRule(name, 1, "#000", "d", f)\nU = Other("coreference")\n'
    )
    assert roles_made(source) == {"sink", "broad"}


def test_analysis_names_only_in_their_own_modules():
    owned = {
        a.name: homes(a)
        for a in registry.analyses()
        if a.scorer.__module__.startswith("headprobe.")
    }
    assert {"dependency", "coreference", "positional", "surface"} <= set(owned)
    registry_path = Path(registry.__file__).resolve()
    role_names = {rule.role for _, rule in registry.role_rules()}
    spelled = []
    for path, text in sources().items():
        constants = string_constants(text)
        if path.resolve() == registry_path:  # the registry's input kinds are its own fact
            constants -= set(registry.INPUTS)
        constants -= roles_made(text) & role_names  # a role's name where its rule is made
        for name, home in owned.items():
            if path.resolve() not in home and name in constants:
                spelled.append(f"{path.relative_to(PACKAGE.parent)} spells {name!r}")
    assert not spelled, "analysis names outside their own modules:\n" + "\n".join(spelled)


# -- module paths: where attention lives in a model is found by headprobe/model/discovery.py ----
# names transformers gives attention modules and their projections: a table of these, or of
# dotted paths through them, is a second owner of the fact `AttentionSite` carries
PROJECTIONS = {
    "dense", "o_proj", "out_proj", "c_proj", "c_attn", "out_lin", "Wo", "Wqkv", "q_proj",
    "k_proj", "v_proj", "q_lin", "k_lin", "v_lin", "qkv_proj", "query_key_value", "value_proj",
    "query_proj", "key_proj", "self_attn", "self_attention", "SelfAttention", "EncDecAttention",
    "encoder_attn", "crossattention",
}  # fmt: skip
# names that are module names only inside a dotted path ("attention.output.dense")
PARTS = PROJECTIONS | {
    "attention", "attn", "self", "output", "o", "q", "k", "v", "query", "key", "value",
    "layer", "layers", "h", "block", "blocks",
}  # fmt: skip
SITES_MODULE = PACKAGE / "model" / "discovery.py"


def names_module(text) -> bool:
    """A string that names a module: a known name, or a dotted path with one among its parts."""
    if not isinstance(text, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.\w+)*", text):
        return False
    parts = text.split(".")
    return text in PROJECTIONS or (len(parts) > 1 and any(part in PARTS for part in parts))


def module_path_tables(text: str) -> list[int]:
    """Line numbers of tuples, lists, sets and dict keys holding 2 or more module paths."""
    found = []
    for node in ast.walk(ast.parse(text)):
        items = (
            node.elts
            if isinstance(node, (ast.Tuple, ast.List, ast.Set))
            else node.keys
            if isinstance(node, ast.Dict)
            else []
        )
        paths = [
            item for item in items if isinstance(item, ast.Constant) and names_module(item.value)
        ]
        if len(paths) >= 2:
            found.append(node.lineno)
    return found


def test_module_path_tables_are_found():
    source = (
        'OUT = ("attention.output.dense", "attn.c_proj", "self_attn.o_proj")\n'
        'NAMES = ["o_proj", "out_proj"]\nFIELDS = {"encoder": "encoder_attentions"}\n'
        'KEYS = ("position_ids", "use_cache")\nONE = ("c_proj",)\n'
    )
    assert module_path_tables(source) == [1, 2]
    assert module_path_tables(SITES_MODULE.read_text(encoding="utf-8"))  # the owner has its table


def test_no_table_of_module_paths_outside_sites():
    tables = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path, text in sources().items()
        if path != SITES_MODULE
        for line in module_path_tables(text)
    ]
    assert not tables, "tables of module paths outside headprobe/model/discovery.py: " + ", ".join(
        tables
    )


# ------------------------------------------------------------------ an analysis whole in its module


def module_path(name: str) -> Path:
    return (PACKAGE.parent / (name.replace(".", "/") + ".py")).resolve()


def builtin_analyses():
    return [a for a in registry.analyses() if a.scorer.__module__.startswith("headprobe.")]


def test_every_role_rule_is_made_in_its_analysis_module():
    """A rule's `match` is defined where its analysis lives, never in the role engine."""
    outside = [
        f"{rule.role!r} of {analysis.name} is made in {rule.match.__module__}"
        for analysis, rule in registry.role_rules()
        if analysis.scorer.__module__.startswith("headprobe.")
        and module_path(rule.match.__module__) not in homes(analysis)
    ]
    assert not outside, "\n".join(outside)
    roles_engine = (PACKAGE / "stats" / "roles.py").read_text(encoding="utf-8")
    assert not roles_made(roles_engine)
    assert "RoleRule(" not in roles_engine  # the engine makes no rule of its own


def test_every_report_section_lives_beside_its_analysis():
    """A declared section is defined in the analysis's own modules (under `headprobe/studies/`),
    not in `headprobe/report/`, which holds only the generic sections and primitives."""
    wrong = []
    for analysis in builtin_analyses():
        section = analysis.report_section()
        if section is None:
            continue
        where = module_path(section.__module__)
        if where not in homes(analysis) or (PACKAGE / "report") in where.parents:
            wrong.append(f"{analysis.name}: {section.__module__}.{section.__name__}")
    assert not wrong, "sections outside their analyses' modules:\n" + "\n".join(wrong)


def imported_modules(text: str) -> set[str]:
    """The `headprobe.*` modules a source imports from (`from M import x`, `import M`)."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m.startswith("headprobe.")}


def test_generic_code_imports_no_analysis_module():
    """Outside `headprobe/studies/` (and an analysis's declared homes), no module imports an
    analysis's module: labels, rules, sections and views are reached through the registry. The
    package's `__init__` and `headprobe.extend` (the API of extension) re-export the public
    pattern API."""
    owned = {}
    for analysis in builtin_analyses():
        for path in homes(analysis):
            owned.setdefault(path, set()).add(analysis.name)
    all_homes = set(owned)
    studies = PACKAGE / "studies"
    found = []
    for path, text in sources().items():
        public = (PACKAGE / "__init__.py", PACKAGE / "extend" / "__init__.py")
        if studies in path.parents or path in all_homes or path in public:
            continue
        for module in sorted(imported_modules(text)):
            target = module_path(module)
            if target in owned:
                found.append(f"{path.relative_to(PACKAGE.parent)} imports {module}")
    assert not found, "analysis modules imported by generic code:\n" + "\n".join(found)


def distinct_labels(analysis) -> set[str]:
    """The analysis's own label names: its scorer module's `LABELS` and its headline
    labels, less ALL and names that are also some analysis's baseline or direction."""
    import importlib

    from headprobe.inputs.corpora.base import ALL

    module = importlib.import_module(analysis.scorer.__module__)
    labels = {str(x) for x in (*getattr(module, "LABELS", ()), *analysis.headline)}
    shared = {ALL} | {
        x for a in registry.analyses() for x in (*a.baselines, *a.directions) if isinstance(x, str)
    }
    return labels - shared


def test_label_lists_only_in_their_analyses_modules():
    """No module outside an analysis's own spells two or more of its labels (a copied list)."""
    found = []
    for analysis in builtin_analyses():
        labels = distinct_labels(analysis)
        if len(labels) < 2:
            continue
        own = homes(analysis)
        for path, text in sources().items():
            if path.resolve() in own:
                continue
            spelled = labels & string_constants(text)
            if len(spelled) >= 2:
                found.append(
                    f"{path.relative_to(PACKAGE.parent)} spells {analysis.name}'s labels "
                    f"{sorted(spelled)}"
                )
    assert not found, "label lists outside their analyses' modules:\n" + "\n".join(found)


def test_label_test_finds_a_copied_list(tmp_path):
    """`string_constants` sees a copied list of labels (what the label test counts)."""
    text = '"""doc: pronoun proper"""\nHEADLINE = ("ALL", "pronoun", "proper")\n'
    assert {"pronoun", "proper"} <= string_constants(text)
    assert "doc: pronoun proper" not in string_constants(text)


PER_BATCH = {"batch", "layer", "att", "attention", "state"}  # what a per-batch method takes
SCORER_CONTRACTS = ("base", "model_scorer", "weights_scorer")  # scoring/'s scorer kinds


def assigned_to_self(function: ast.FunctionDef) -> list[str]:
    """`self.x = ...`, `self.x[k] = ...`, `self.x += ...`, `del self.x` inside a function."""
    found = []
    for node in ast.walk(function):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    root = sub
                    while isinstance(root, (ast.Attribute, ast.Subscript)):
                        root = root.value
                    if isinstance(sub, (ast.Attribute, ast.Subscript)) and (
                        isinstance(root, ast.Name) and root.id == "self"
                    ):
                        found.append(f"line {node.lineno}: {ast.unparse(target)}")
                        break
    return found


def scorer_methods_assigning_to_self(text: str) -> list[str]:
    """Of the scorer classes (named `...Scorer`, or mixed into one: `...Rows`) of a source."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.ClassDef) or not node.name.endswith(("Scorer", "Rows")):
            continue
        for item in node.body:
            if not isinstance(item, ast.FunctionDef):
                continue
            names = {a.arg for a in (*item.args.args, *item.args.kwonlyargs)}
            if names & PER_BATCH:
                out += [f"{node.name}.{item.name} {hit}" for hit in assigned_to_self(item)]
    return out


def test_no_scorer_method_that_takes_a_batch_assigns_to_self():
    """The scorer contract: a method that takes a batch, a layer, attention or a batch's state
    keeps what it computes in the state it returns or receives, never on the scorer."""
    contracts = [PACKAGE / "scoring" / f"{name}.py" for name in SCORER_CONTRACTS]
    found = []
    for path, text in sources().items():
        if (PACKAGE / "studies") in path.parents or path in contracts:
            found += [
                f"{path.relative_to(PACKAGE.parent)}: {x}"
                for x in scorer_methods_assigning_to_self(text)
            ]
    assert not found, "per-batch state kept on a scorer:\n" + "\n".join(found)


def test_the_self_assignment_check_finds_one():
    text = (
        "class SScorer:\n"
        "    def update(self, layer, att, state):\n"
        "        self._rows = []\n"
        "        self.cache[layer] = att\n"
        "        state.own.append(att)\n"
        "    def bind(self, n):\n"
        "        self.n = n\n"
    )
    assert scorer_methods_assigning_to_self(text) == [
        "SScorer.update line 3: self._rows",
        "SScorer.update line 4: self.cache[layer]",
    ]


def _declaring_folders() -> dict[str, tuple[Path, object]]:
    """Each option an analysis or a probe declares, by name: (the folder it lives in, the Option)."""
    from headprobe.scoring import registry

    found = {}
    for what in [*registry.analyses(), *registry.probes()]:
        for option in what.options:
            if not isinstance(option, str):
                module = option.check.__module__ if option.check else what.__module__
                found[option.name] = (module_path(module).parent, option)
    return found


def test_an_option_belongs_to_its_analysis():
    """An option an analysis (or a probe) reads alone is declared in its folder, with its check
    and help: no other module of `headprobe/` spells its flag, and `config.py` declares none of
    them (it assembles them from the registry)."""
    from headprobe.config import CoreOptions

    declared = _declaring_folders()
    core = {f.name for f in dataclasses.fields(CoreOptions)}
    assert declared and not core & set(declared)
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for folder, option in declared.values():
            if option.flag and folder not in path.parents and f'"{option.flag}' in text:
                spelled.append(f"{path.relative_to(PACKAGE.parent)} spells {option.flag}")
    assert not spelled, "\n".join(spelled)


def test_the_retrieval_study_owns_the_needle_probe():
    """The built-in retrieval study, needle probe included, lives in its folder: no file outside
    it names the needle options."""
    folder = PACKAGE / "studies" / "retrieval"
    names = (
        "needle_lengths",
        "needle_depths",
        '"needles"',
        ".needles",
        "--needle",
        '"retrieval_check"',
        ".retrieval_check",
    )
    outside = [
        f"{path.relative_to(PACKAGE.parent)}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if folder not in path.parents
        for name in names
        if name in path.read_text(encoding="utf-8")
    ]
    assert not outside, "\n".join(outside)


def test_no_lower_layer_imports_the_configuration():
    """Nothing below `config.py` imports it, not even for type checking (`if TYPE_CHECKING:`)."""
    import ast

    lower = (
        "core",
        "inputs",
        "model",
        "checks",
        "scoring",
        "stats",
        "results",
        "report",
        "studies",
        "core_options",
    )
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[0] not in lower:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "headprobe.config"
            ):
                found.append(str(path.relative_to(PACKAGE.parent)))
            elif isinstance(node, ast.Import) and any(
                a.name.startswith("headprobe.config") for a in node.names
            ):
                found.append(str(path.relative_to(PACKAGE.parent)))
    assert not found, f"below config.py, importing it: {sorted(set(found))}"


# ------------------------------------------------------------------ modules: size and names
MAX_MODULE_LINES = 600
# names every package or analysis folder has by convention: Python's own (`__init__`,
# `__main__`), and an analysis folder's `analysis.py` (its registration) and `report.py` (its
# report section), named by the folder they sit in (`headprobe/studies/<analysis>/`)
CONVENTION_NAMES = {"__init__.py", "__main__.py"}
STUDY_NAMES = {"analysis.py", "report.py"}


def module_clashes(paths) -> dict[str, list[str]]:
    """File name -> the modules that share it (two or more), leaving out the names every folder
    has by convention (`CONVENTION_NAMES`) and an analysis folder's own (`STUDY_NAMES`, directly
    under `studies/`)."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        if path.name in CONVENTION_NAMES:
            continue
        if path.name in STUDY_NAMES and path.parent.parent.name == "studies":
            continue
        by_name.setdefault(path.name, []).append(str(path))
    return {name: sorted(found) for name, found in by_name.items() if len(found) > 1}


def test_module_clashes_are_found():
    paths = [
        Path("headprobe/stats/selection.py"),
        Path("headprobe/report/selection.py"),
        Path("headprobe/studies/dependency/analysis.py"),
        Path("headprobe/studies/sink/analysis.py"),
        Path("headprobe/report/analysis.py"),
        Path("headprobe/__init__.py"),
        Path("headprobe/model/__init__.py"),
    ]
    assert module_clashes(paths) == {
        "selection.py": ["headprobe/report/selection.py", "headprobe/stats/selection.py"]
    }
    # an analysis.py outside an analysis folder has no folder to name it
    outside = module_clashes(paths + [Path("headprobe/studies/analysis.py")])
    assert outside["analysis.py"] == [
        "headprobe/report/analysis.py",
        "headprobe/studies/analysis.py",
    ]


def test_no_two_modules_share_a_name():
    """A module's name says what it owns: no two modules of `headprobe/` share a file name (an
    analysis folder's `analysis.py` and `report.py` are named by their folder)."""
    clashes = module_clashes(p.relative_to(PACKAGE.parent) for p in PACKAGE.rglob("*.py"))
    assert not clashes, "modules that share a name:\n" + "\n".join(
        f"{name}: {', '.join(paths)}" for name, paths in sorted(clashes.items())
    )


def test_no_module_over_600_lines():
    long = [
        f"{path.relative_to(PACKAGE.parent)} ({n} lines)"
        for path, text in sources().items()
        if (n := len(text.splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


# ------------------------------------------------------------------ the pad id: one owner
class _Tokenizer:
    def __init__(self, pad, eos):
        self.pad_token_id, self.eos_token_id = pad, eos


def test_the_pad_id_falls_back_pad_then_eos_then_zero():
    from headprobe.model.padding import padding_id

    assert padding_id(_Tokenizer(3, 7)) == 3
    assert padding_id(_Tokenizer(None, 7)) == 7
    assert padding_id(_Tokenizer(None, None)) == 0
    assert padding_id(_Tokenizer(0, 7)) == 0  # a pad id of 0 is a pad id


def test_the_pad_id_is_picked_in_one_place():
    """Only `model/padding.py` reads a tokenizer's pad id to pad a batch."""
    found = {
        str(path.relative_to(PACKAGE))
        for path, text in sources().items()
        if "tokenizer.pad_token_id" in text
    }
    assert found == {"model/padding.py"}


# what results/ may not import: the model (its control's names and tables are no model), the
# passes that run it, and the libraries that do
RESULTS_MAY_NOT = (
    "headprobe.model",
    "headprobe.scoring.engine",
    "headprobe.scoring.sentence_attention",
    "torch",
    "transformers",
)
RESULTS_MAY = (
    "headprobe.model.control",  # names and tables of the random-init control (pandas)
    "transformers.utils",  # constants: the name of a model's config file
)


def runs_a_model(source: str) -> list[str]:
    """The imports of a module's source (anywhere in it) that `results/` may not make."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            banned = any(name == b or name.startswith(b + ".") for b in RESULTS_MAY_NOT)
            allowed = any(name == a or name.startswith(a + ".") for a in RESULTS_MAY)
            if banned and not allowed:
                found.append(name)
    return sorted(set(found))


def test_results_run_no_model():
    """`results/` reads what the passes produce (the example pictures' and the explorer's
    attention is drawn by `scoring.sentence_attention`): none of its modules imports the model
    layer, a pass, torch or transformers."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}: {', '.join(names)}"
        for path, text in sources().items()
        if path.relative_to(PACKAGE).parts[0] == "results"
        for names in [runs_a_model(text)]
        if names
    ]
    assert not found, "\n".join(found)


def test_the_results_rule_finds_a_capture():
    old = "import torch\nfrom headprobe.model.capture import AttentionCapture\n"
    assert runs_a_model(old) == [
        "headprobe.model.capture",
        "headprobe.model.capture.AttentionCapture",
        "torch",
    ]
    assert runs_a_model("from headprobe.model.control import TRAINED\n") == []
    assert runs_a_model("def f():\n    from headprobe.scoring import sentence_attention\n") == [
        "headprobe.scoring.sentence_attention"
    ]
