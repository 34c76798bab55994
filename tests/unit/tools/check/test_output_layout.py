"""A channels-first tower output is named as such (issue 26, item 7): it was reported as "check the spec's
out_hidden_size geometry", which sends a user to the one field that is right."""

from __future__ import annotations

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

from vitcg.tools.check.cases import channels_first


def test_a_channels_first_output_is_named_with_its_dimension_and_the_fix():
    output = BaseModelOutputWithPooling(last_hidden_state=torch.zeros(2, 48, 4, 6))
    message = channels_first(output, ("last_hidden_state",), 48)
    assert message is not None
    assert message.startswith("encoder output 'last_hidden_state' has shape (2, 48, 4, 6): its features lie on dim 1")
    assert "out_hidden_size is not what is wrong" in message and "encoder.method" in message


def test_rows_of_features_and_other_widths_are_not_channels_first():
    rows = BaseModelOutputWithPooling(last_hidden_state=torch.zeros(2, 16, 48))
    assert channels_first(rows, ("last_hidden_state",), 48) is None
    wrong_width = BaseModelOutputWithPooling(last_hidden_state=torch.zeros(2, 16, 32))
    assert channels_first(wrong_width, ("last_hidden_state",), 48) is None  # a wrong width: the manager's message
    per_item = BaseModelOutputWithPooling(pooler_output=(torch.zeros(1, 48, 2, 2), torch.zeros(1, 48, 3, 3)))
    assert "'pooler_output[*]' has shape (1, 48, 2, 2)" in channels_first(per_item, ("pooler_output[*]",), 48)
