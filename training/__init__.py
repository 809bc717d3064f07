"""Training scripts for the speculative drafters (draft model, Medusa heads, EAGLE layer).

Everything here runs on the CPU with the real SmolLM2-135M-Instruct weights and is self-distillation:
the data is text the target model generates itself from `prompts.py` (greedy), so every label is
the target's own choice. Run in order:

    python -m training.generate_data      # ~10 min: prompts -> greedy responses -> target features
    python -m training.train_draft_model  # small draft model (issue 6)
    python -m training.train_medusa       # Medusa heads (issue 7)
    python -m training.train_eagle        # EAGLE layer (issue 7)

The trained weights (fp16 safetensors) and a JSON training log land in `engine/assets/spec_heads/`.
"""
