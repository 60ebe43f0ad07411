"""Prose for the degeneration and consistency checks: a clean paragraph of a novel and a
loop that repeats one sentence."""

CLEAN_PROSE = (
    "Mara climbed the spiral stairs with the letter folded inside her oilskin. The storm had torn the "
    "shutters loose on the north side, and rain ran in ribbons down the lamp-room glass. She set the "
    "envelope beside the logbook and read her own name in her sister's careful, slanted hand. Ten years "
    "of silence broke in a single line of ink. Below, the sea threw itself at the rocks as if it wanted "
    "the tower back. Tobias would not cross until the wind dropped, and nobody else knew the island's "
    "landing. She trimmed the wick, wound the clockwork and counted the seconds between flashes, because "
    "counting was easier than thinking. When she finally broke the seal, the paper smelled of salt and "
    "lavender, the soap their mother used to buy in Kirkwall every spring."
)
LOOP = "The message is a message that will be sent to all future generations. " * 20
