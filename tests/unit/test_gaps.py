"""The list of model types no spec covers (vitcg/lang/gaps.py) stays true: nothing listed is covered by a spec,
every listed type exists in transformers, and the generated supported-models doc shows every reason."""

import pytest
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from vitcg.lang import load_registry
from vitcg.lang.bindings import release, transformers_version
from vitcg.lang.gaps import GAPS

NEWEST = "5.23"


def test_no_listed_model_type_is_covered_by_a_spec(repo):
    covered = {t for spec in load_registry([repo / "vitcg" / "specs"]) for t in spec.model_types}
    listed = [t for gap in GAPS for t in gap.model_types]
    assert len(listed) == len(set(listed))
    assert not covered & set(listed)


@pytest.mark.skipif(release(transformers_version()) < release(NEWEST),
                    reason=f"the list is of model types transformers {NEWEST} has")
def test_every_listed_model_type_exists_in_transformers():
    missing = [t for gap in GAPS for t in gap.model_types if t not in CONFIG_MAPPING_NAMES]
    assert not missing


def test_the_supported_models_doc_lists_every_gap(repo):
    text = (repo / "registry" / "SUPPORTED_MODELS.md").read_text()
    for gap in GAPS:
        assert gap.reason in text and all(f"`{t}`" in text for t in gap.model_types)
