/* The table of graphs of steps with prompt rows (engine/graphs.c): a key
 * is captured the second time it comes, so a key that came once must not
 * keep its slot from keys that repeat. */
#include <stdint.h>

#include "engine/internal.h"
#include "test.h"

static int dummy_graph;

/* what a step does with its slot (sd__mixed_launch): runs eagerly the first
 * time, is captured the second */
static int use(sd_mgraph *tab, int *n, int cap, uint64_t *clock, int T, int n_out, int hidden)
{
    int i = sd__mgraph_slot(tab, n, cap, clock, T, n_out, hidden);
    if (i < 0)
        return i;
    if (!tab[i].seen)
        tab[i].seen = 1;
    else
        tab[i].graph = &dummy_graph;
    return i;
}

TEST(a_key_finds_its_own_slot_and_keys_differ_by_rows_logits_rows_and_hidden_states)
{
    sd_mgraph tab[8] = {0};
    int n = 0;
    uint64_t clock = 0;
    int a = use(tab, &n, 8, &clock, 16, 1, 0);
    ASSERT_EQ(use(tab, &n, 8, &clock, 16, 1, 0), a);
    ASSERT(tab[a].graph != NULL); /* captured the second time */
    int b = use(tab, &n, 8, &clock, 16, 2, 0), c = use(tab, &n, 8, &clock, 16, 1, 1),
        d = use(tab, &n, 8, &clock, 32, 1, 0);
    ASSERT(a != b && a != c && a != d && b != c && b != d && c != d);
    ASSERT_EQ(n, 4);
    ASSERT(tab[b].graph == NULL && tab[b].seen);
}

TEST(a_full_table_gives_the_oldest_uncaptured_slot_to_a_new_key_and_keeps_graphs)
{
    enum { CAP = 4 };
    sd_mgraph tab[CAP] = {0};
    int n = 0;
    uint64_t clock = 0;
    int a = use(tab, &n, CAP, &clock, 8, 1, 0);
    use(tab, &n, CAP, &clock, 8, 1, 0); /* a captured */
    int b = use(tab, &n, CAP, &clock, 16, 1, 0);
    int c = use(tab, &n, CAP, &clock, 24, 1, 0);
    int d = use(tab, &n, CAP, &clock, 32, 1, 0);
    use(tab, &n, CAP, &clock, 16, 1, 0); /* b captured */
    ASSERT_EQ(n, CAP);
    /* full: the new key takes c's slot (seen once, longest ago) */
    ASSERT_EQ(use(tab, &n, CAP, &clock, 40, 1, 0), c);
    /* c again: now d's is the oldest uncaptured one */
    ASSERT_EQ(use(tab, &n, CAP, &clock, 24, 1, 0), d);
    /* the graphs keep their slots and keys */
    ASSERT_EQ(use(tab, &n, CAP, &clock, 8, 1, 0), a);
    ASSERT_EQ(use(tab, &n, CAP, &clock, 16, 1, 0), b);
    ASSERT(tab[a].graph && tab[b].graph);
    /* every slot captured: no slot, the step runs eagerly */
    use(tab, &n, CAP, &clock, 40, 1, 0);
    use(tab, &n, CAP, &clock, 24, 1, 0);
    for (int i = 0; i < CAP; i++)
        ASSERT(tab[i].graph != NULL);
    ASSERT_EQ(use(tab, &n, CAP, &clock, 48, 1, 0), -1);
    ASSERT_EQ(n, CAP);
}

/* Under arrivals the first steps bring many keys once; a key that starts
 * repeating after them still gets its graph. */
TEST(keys_that_repeat_after_many_one_offs_are_captured)
{
    sd_mgraph tab[SD_MAX_MGRAPHS] = {0};
    int n = 0;
    uint64_t clock = 0;
    for (int i = 0; i < 3 * SD_MAX_MGRAPHS; i++)
        ASSERT(use(tab, &n, SD_MAX_MGRAPHS, &clock, 1 + i % 256, 1 + i / 256, i % 2) >= 0);
    ASSERT_EQ(n, SD_MAX_MGRAPHS);
    /* three keys that repeat, each among new one-offs */
    const int keys[3][2] = {{512, 1}, {512, 2}, {1024, 1}};
    int slot[3];
    for (int r = 0; r < 4; r++)
        for (int k = 0; k < 3; k++) {
            slot[k] = use(tab, &n, SD_MAX_MGRAPHS, &clock, keys[k][0], keys[k][1], 0);
            ASSERT(slot[k] >= 0);
            ASSERT(use(tab, &n, SD_MAX_MGRAPHS, &clock, 2000 + 7 * r + k, 3, 1) >= 0);
        }
    for (int k = 0; k < 3; k++) {
        ASSERT(tab[slot[k]].graph != NULL);
        ASSERT_EQ(tab[slot[k]].T, keys[k][0]);
        ASSERT_EQ(tab[slot[k]].n_out, keys[k][1]);
    }
}

TEST_MAIN(T(a_key_finds_its_own_slot_and_keys_differ_by_rows_logits_rows_and_hidden_states),
          T(a_full_table_gives_the_oldest_uncaptured_slot_to_a_new_key_and_keeps_graphs),
          T(keys_that_repeat_after_many_one_offs_are_captured))
