/*
 * nn_loss.h - the training loss in one pass: softmax cross-entropy from the
 * logits, its gradient and the argmax hits, per row, with the exponentials
 * computed once. The oneDNN log-softmax plus xent_forward / xent_backward /
 * accuracy_count (nn_ref.h) compute the same thing in four passes; they stay
 * the reference (tests/c/test_nn_loss.c) and serve evaluation and prediction.
 *
 * Shape letters as in nn_ref.h: B batch, K classes.
 */
#ifndef NN_LOSS_H
#define NN_LOSS_H

#include <stdint.h>

/* From logits[B,K] and targets (labels[B] int32 in [0,K) or onehot[B,K], one
 * of them NULL): dlogits[B,K] = (softmax - target) / B (dlogits may be NULL:
 * loss and hits only), *loss_sum = the sum over rows of -sum_k target_k *
 * log_softmax_k (through x - max - log(sum exp(x - max))), *correct = rows
 * whose argmax(logits) is the label (argmax of onehot). Returns 0, or -1 with
 * *bad set to the first row whose label is out of range (outputs then
 * unspecified). */
int softmax_xent_train(float *dlogits, double *loss_sum, int *correct, const float *logits,
                       const int32_t *labels, const float *onehot, int B, int K, int *bad);

#endif /* NN_LOSS_H */
