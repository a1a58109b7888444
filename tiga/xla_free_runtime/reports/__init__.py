"""runtime reports: explain() (explain), run reports of tg.profile (runs) and progress
bars (progress)."""
