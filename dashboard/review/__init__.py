"""Team review and the reads behind the pages: verdicts, saved comparisons,
pinned baselines (``models``; Django app label ``dashboard``), their writes
(``services``), and what the pages read from the store (``queries``,
``run_facts``, ``phase``, ``seeds``, ``emptiness``)."""
