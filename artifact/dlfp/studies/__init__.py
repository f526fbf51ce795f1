"""Studies that check parts of the artifact against external measurements and write tables under data/results/."""
