"""MoE RLVR trainer: a small PyTorch trainer for studying RL instability on
Mixture-of-Experts language models. Never imports Django."""

__version__ = "0.1.0"
