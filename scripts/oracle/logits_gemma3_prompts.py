"""Prompts for the real-model oracle (logits_gemma3.py). Plain data, original text."""

SHORT = "The capital of France is"

CODE = '''def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals and return them sorted."""
    if not intervals:
        return []
    intervals = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(intervals[0])]
    for start, end in intervals[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return merged


if __name__ == "__main__":
    print(merge_intervals([[1, 3], [2, 6], [8, 10], [15, 18]]))
'''

MEDIUM = (
    "Bread is one of the oldest prepared foods. Long before anyone wrote down a recipe, people "
    "ground wild grains between stones, mixed the flour with water and baked the paste on hot "
    "rocks. The result was flat and dense. Leavened bread came later, probably by accident, when "
    "a batter left out in the warm air began to bubble. Today a baker can choose from hundreds of "
    "flours, yeasts and techniques, yet the basic steps have hardly changed: mix, knead, rest, "
    "shape and bake."
)

# Longer than Gemma 3's 512-token sliding window (about 700 tokens with BOS).
LONG = (
    "The lighthouse on the northern cape was built in 1871, after three ships were lost on the "
    "same reef in a single winter. The engineers who designed it had to solve problems that no "
    "one in the region had faced before. The rock was too hard to drill with the tools they "
    "brought, the nearest quarry was two days away by boat, and the weather allowed work for "
    "only four months of the year. They decided to cut the stones on the mainland, number each "
    "one, and ship them across in calm weeks, so that the tower could be assembled like a puzzle. "
    "Each course of granite was dovetailed into the one below it, which made the walls strong "
    "enough to survive waves that sometimes broke over the lantern itself.\n\n"
    "For most of its history the light was kept by families. A keeper, his wife and often their "
    "children lived in the small cottage at the foot of the tower. Their days followed a strict "
    "routine. At dusk the keeper climbed the spiral staircase, trimmed the wicks, and lit the "
    "lamps. Through the night someone had to stay awake to wind the clockwork that turned the "
    "lens, because a light that stopped turning could be mistaken for a different station and "
    "send a captain onto the rocks. At dawn the lamps were put out, the brass was polished, and "
    "the great glass prisms were cleaned of soot. A logbook recorded the weather, the ships that "
    "passed, and every small repair.\n\n"
    "Supplies arrived by boat once a month when the sea allowed it. In bad years the boat could "
    "not land for weeks, and the families learned to keep a garden in the thin soil behind the "
    "cottage, to salt fish, and to store rainwater in a cistern cut into the rock. Children were "
    "taught at home until they were old enough to board at a school in the harbor town. Many of "
    "them later said that the silence of the cape, broken only by wind and the cries of seabirds, "
    "had shaped the rest of their lives.\n\n"
    "Technology changed the work slowly and then all at once. Kerosene replaced whale oil at the "
    "end of the nineteenth century, giving a brighter and steadier flame. In the 1920s a diesel "
    "generator was installed, and an electric lamp took the place of the burners. A radio meant "
    "that the keepers could finally report storms and wrecks as they happened instead of waiting "
    "for the supply boat. Each of these improvements made the station safer, but each also "
    "removed a task that had once needed a person.\n\n"
    "The last keeper left in 1989, when the light was automated. Sensors now switch the lamp on "
    "at sunset, a small computer checks the bulb and the batteries, and a technician visits twice "
    "a year. The cottage was restored by a local society and opened as a museum. Visitors can "
    "climb the same staircase, read pages from the old logbooks, and look out over the reef that "
    "made the tower necessary in the first place. On clear evenings, when the beam sweeps across "
    "the water, it is easy to imagine the keeper's family at the window, counting the seconds "
    "between flashes and watching for the lights of a ship that might need them.\n\n"
    "Historians who study the station point out that its story is not only about engineering or "
    "isolation. It is also about trust. Sailors who had never met the keepers relied on them "
    "completely, night after night, and the keepers in turn relied on distant strangers to bring "
    "food, fuel and news. The tower stood between those two worlds, and for more than a century "
    "the simple promise that the light would be there kept both of them connected."
)

TEACHER = {"short": SHORT, "code": CODE, "medium": MEDIUM, "long": LONG}

CHAT = "<start_of_turn>user\n{msg}<end_of_turn>\n<start_of_turn>model\n"

GREEDY = {
    "capital_raw": SHORT,
    "story_raw": "Once upon a time, in a small village by the sea, there lived",
    "capital_chat": CHAT.format(msg="What is the capital of France?"),
    "poem_chat": CHAT.format(msg="Write a short poem about the ocean."),
}

# The 40-token sequence of the context-shift reference: the first 40 tokens (BOS included) of
# this text.
SHIFT_TEXT = LONG
