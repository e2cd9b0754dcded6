"""Token mixers (one module per mixer, registered by `conf/mixer/<name>.yaml`) and the backbone model.

`mixers.base.Mixer` is the contract (docs/design.md §4); `mixers.model.LanguageModel` is the backbone that
builds one mixer per layer from its config.
"""
