import pytest

from cliffguard.data.curriculum import Curriculum, parse_curriculum


def test_categories_from_globs():
    c = Curriculum(categories={"code": ["**/*.py"], "docs": ["docs/*"]}, default="web")
    assert c.category("a.py") == "code" and c.category("pkg/sub/a.py") == "code"
    assert c.category("docs/x.md") == "docs" and c.category("x.md") == "web"


def test_spec_from_file(tmp_path):
    f = tmp_path / "c.json"
    f.write_text('{"categories": {"code": ["*.py"]}, "phases": [{"until": 1.0, "weights": {"code": 2}}]}')
    assert parse_curriculum(str(f)).phases[0]["weights"] == {"code": 2}


@pytest.mark.parametrize(("spec", "message"), [
    ('{"phases": [{"until": 0.5}]}', "last phase must end"),
    ('{"phases": [{"until": 0.6}, {"until": 0.4}]}', "phase 1 needs an 'until'"),
    ('{"phases": [{"until": 1.0, "weights": {"math": 1}}]}', "unknown categories ['math']"),
    ('{"phases": [{"until": 1.0, "weights": {"other": -1}}]}', "non-negative"),
    ('{"colour": 1}', "must be an object"),
    ("nope.json", "neither inline JSON nor an existing file"),
])
def test_bad_specs(spec, message):
    with pytest.raises(ValueError, match="^(curriculum|phases):") as exc:
        parse_curriculum(spec)
    assert message in str(exc.value)
