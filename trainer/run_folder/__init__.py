"""The run folder's contract: its file names and readers (``files``), the lease
and lock that guard it (``guard``) and the warm-start progress file
(``warmstart_progress``).

Torch-free and below everything that reads a run folder (the analysis, the
export, the studies, the loop that writes it, and the platform): docs/design.md
3.4 and 1.1.
"""
