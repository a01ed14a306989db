#include "target/rope.h"

#include <math.h>
#include <stdlib.h>

static double find_correction_dim(double rotations, int dim, double base, double max_pos)
{
    return (dim * log(max_pos / (rotations * 2 * M_PI))) / (2 * log(base));
}

int sd_rope_inv_freq(const sd_rope_cfg *r, int max_pos, float **inv, sd_err *err)
{
    int dim = r->rot_dim, half = dim / 2;
    if (dim <= 0 || dim % 2)
        return sd_err_set(err, SD_EINVAL, "rope: rotary dimension %d is not a positive even number",
                          dim);
    float *f = malloc((size_t)half * sizeof(float));
    if (!f)
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    /* HF: 1 / base ** (arange(0, dim, 2).float() / dim), in fp32 */
    for (int i = 0; i < half; i++)
        f[i] = (float)(1.0 / pow(r->theta, (double)(float)(2 * i) / dim));
    double factor = r->factor > 0 ? r->factor : 1.0;
    switch (r->type) {
    case SD_ROPE_DEFAULT: break;
    case SD_ROPE_LINEAR:
        for (int i = 0; i < half; i++)
            f[i] = (float)(f[i] / factor);
        break;
    case SD_ROPE_LLAMA3: {
        double old = r->original_max_pos, lo = r->low_freq_factor, hi = r->high_freq_factor;
        double low_wl = old / lo, high_wl = old / hi;
        for (int i = 0; i < half; i++) {
            double fr = f[i], wl = 2 * M_PI / fr;
            double v = wl > low_wl ? fr / factor : fr;
            if (!(wl < high_wl) && !(wl > low_wl)) {
                double s = (old / wl - lo) / (hi - lo);
                v = (1 - s) * v / factor + s * v;
            }
            f[i] = (float)v;
        }
        break;
    }
    case SD_ROPE_YARN: {
        double base = r->theta;
        /* As HF: with original_max_position_embeddings given, the factor used
         * for the frequencies and the attention factor is the context ratio. */
        double omax = max_pos;
        if (r->original_max_pos > 0) {
            omax = r->original_max_pos;
            factor = (double)max_pos / omax;
        }
        double bf = r->beta_fast > 0 ? r->beta_fast : 32, bs = r->beta_slow > 0 ? r->beta_slow : 1;
        double low = floor(find_correction_dim(bf, dim, base, omax));
        double high = ceil(find_correction_dim(bs, dim, base, omax));
        if (low < 0)
            low = 0;
        if (high > dim - 1)
            high = dim - 1;
        if (low == high)
            high += 0.001;
        for (int i = 0; i < half; i++) {
            float pos_freq = (float)pow(base, (double)(float)(2 * i) / dim);
            float extra = 1.0f / pos_freq, inter = 1.0f / ((float)factor * pos_freq);
            float ramp = (float)(((double)i - low) / (high - low));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float ef = 1.0f - ramp; /* extrapolation factor */
            f[i] = inter * (1 - ef) + extra * ef;
        }
        break;
    }
    }
    *inv = f;
    return 0;
}
