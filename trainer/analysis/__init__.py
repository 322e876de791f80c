"""Statistics of runs and studies: collapse detection, survival (Kaplan-Meier, log-rank, Cox),
intervals, power, lead-lag, the detector's error rates.

Built on lifelines (Cox models) and scipy (intervals); hand-written code here
is only glue, or an estimator tested equal to the library's.
"""
