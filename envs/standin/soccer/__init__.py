"""The stand-in SoccerTwos scene (see README.md here): `field` (the scene's constants and static
geometry), `rays` (ray perception and frame stacking), `sim` (the arenas' simulation and rules),
`standin` (the protocol side, played with `--scene soccertwos`), `matches` (in-process matches).
"""
