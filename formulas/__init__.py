"""The Python twins of the page's formulas: KV bytes per token and per layer group, a Hugging Face
config read into layer groups, and the cost model (FLOPs and bytes of a step). Pure arithmetic: no torch."""
