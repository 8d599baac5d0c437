"""The pairwise LightGBM, kept under its old import path (:mod:`training.alternatives.pairwise`)."""

from training.alternatives.pairwise import PairwiseLightGBM

__all__ = ["PairwiseLightGBM"]
