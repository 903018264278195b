"""Pre-registered studies (STUDY-1..8): pure.

- `_model`: the study file, its validation and the registration that is frozen and hashed.
- `_variables`: what each variable under test may change, in the config and per scene (STUDY-2).
- `_pairs`: the scenes sampled, the order each reviewer meets the pairs, A/B positions.
- `_stats`: κ, α, the clustered bootstrap interval, position bias and consistency (STUDY-4).
- `_decide`: the figures and the pre-registered rule (STUDY-6); a record generated again from
  the inputs it keeps.
- `_attribution`: a flagged problem traced to its writer's freeze manifest (STUDY-5).
"""

from novelbus.novel.study._attribution import (
    CATEGORY_FIELDS,
    PACK_FIELDS,
    attribute,
    group_by_field,
)
from novelbus.novel.study._decide import (
    UNDECIDED,
    Vote,
    cost_figures,
    decide_again,
    decision_inputs,
    figures,
)
from novelbus.novel.study._model import (
    CHOICES,
    FLAG_CATEGORIES,
    Rule,
    SceneSample,
    Study,
    StudyError,
    StudyFile,
    parse_study_file,
    registration_hash,
    study_from_registration,
)
from novelbus.novel.study._pairs import SceneKey, a_shows_test, reviewer_order, sample_scenes
from novelbus.novel.study._stats import (
    OUTCOMES,
    cohen_kappa,
    krippendorff_alpha,
    outcome,
    position_bias,
    position_consistency,
    win_share,
    win_share_interval,
)
from novelbus.novel.study._variables import (
    FIELDS,
    VARIABLES,
    ArmScene,
    Variable,
    check_scene,
    config_differences,
    refused_differences,
)

__all__ = [
    "CATEGORY_FIELDS", "CHOICES", "FIELDS", "FLAG_CATEGORIES", "OUTCOMES", "PACK_FIELDS", "UNDECIDED", "VARIABLES",
    "ArmScene", "Rule", "SceneKey", "SceneSample", "Study", "StudyError", "StudyFile", "Variable", "Vote",
    "a_shows_test", "attribute", "check_scene", "cohen_kappa", "config_differences", "cost_figures", "decide_again",
    "decision_inputs", "figures", "group_by_field", "krippendorff_alpha", "outcome", "parse_study_file",
    "position_bias", "position_consistency", "refused_differences", "registration_hash", "reviewer_order",
    "sample_scenes", "study_from_registration", "win_share", "win_share_interval",
]
