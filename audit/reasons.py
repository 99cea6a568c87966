"""How much a person must write when a change needs their reason — a re-plan, a settlement or a reset by hand, a bulk
action, a retention's extension: one minimum for every form and service that asks (a forced release asks more:
tasks.people.forced_release.MIN_FORCE_TEXT)."""

MIN_REASON = 10  # characters, spaces around them not counted
