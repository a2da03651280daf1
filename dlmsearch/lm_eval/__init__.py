"""An lm-evaluation-harness backend: ``--model dlmsearch`` decodes ``generate_until`` requests.

```bash
python -m dlmsearch.lm_eval --model_args path=/models/LLaDA-8B-Instruct,family=llada,decoder=fast_dllm \
    --tasks dlmsearch_gsm8k --limit 50
```

Importing this module registers the model with lm-eval (``python -m dlmsearch.lm_eval`` does
that, adds dlmsearch's offline tasks of :mod:`dlmsearch.lm_eval.shipped`, then runs lm-eval's
own command line). The parts: :mod:`~dlmsearch.lm_eval.backend` (the registered model),
:mod:`~dlmsearch.lm_eval.model_args` (its arguments, checked), :mod:`~dlmsearch.lm_eval.request_kwargs`
(what a request's generation kwargs mean).
"""

from __future__ import annotations

from dlmsearch.lm_eval.backend import DLMSearchLM
from dlmsearch.lm_eval.model_args import ModelArgsError
from dlmsearch.lm_eval.request_kwargs import cut_at_stop, gen_length_for

__all__ = ["DLMSearchLM", "ModelArgsError", "cut_at_stop", "gen_length_for"]
