"""A live GlusterFS volume as a source: cuts (:mod:`.cut`), its bricks' changelogs between cuts
(:mod:`.changelog`), what a brick says about a gfid (:mod:`.backend`), the epoch's canonical
records (:mod:`.resolve`, :mod:`.state`) and its bytes read from a cut (:mod:`.reader`)."""
