"""The list of model types no spec covers (vitcg/lang/gaps.py) stays true: nothing listed is covered by a spec,
every listed type exists in the newest transformers CI runs, and the generated supported-models doc, the README
and docs/writing-specs.md name every one."""

import re

import pytest
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from support import REPO
from support.specs import packaged
from vitcg.lang.bindings import release, transformers_version
from vitcg.lang.gaps import GAPS

SETUP = (REPO / ".ci" / "setup").read_text()
NEWEST = re.search(r"^transformers=\$\{2:-([0-9.]+)\}$", SETUP, re.M).group(1)
"""CI's newest stage (.ci/setup's default; tests/unit/lang/test_transformers_range.py ties it to pyproject's range):
the list is of model types that release has. An older one may lack some."""
LISTED = [t for gap in GAPS for t in gap.model_types]


def test_no_listed_model_type_is_covered_by_a_spec(repo):
    covered = {t for spec in packaged() for t in spec.model_types}
    assert len(LISTED) == len(set(LISTED))
    assert not covered & set(LISTED)


@pytest.mark.skipif(release(transformers_version()) < release(NEWEST),
                    reason=f"the list is of model types transformers {NEWEST} has")
def test_every_listed_model_type_exists_in_transformers():
    missing = [t for t in LISTED if t not in CONFIG_MAPPING_NAMES]
    assert not missing


def test_the_supported_models_doc_lists_every_gap(repo):
    text = (repo / "registry" / "SUPPORTED_MODELS.md").read_text()
    for gap in GAPS:
        assert gap.reason in text and all(f"`{t}`" in text for t in gap.model_types)


@pytest.mark.parametrize(("page", "section"), [("README.md", None),
                                               ("docs/writing-specs.md", "## Models not expressible yet")])
def test_the_readme_and_the_spec_guide_name_every_gap(repo, page, section):
    """By model type, in backticks: the README's paragraph of what specs cover, the guide's section on gaps."""
    text = (repo / page).read_text()
    if section is not None:
        text = text[text.index(section):].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z0-9_]+)`", text))
    assert [t for t in LISTED if t not in named] == []
