/*
 * notebook.cu: the classic kernel of the course's notebook, whose parameters
 * are (A, B, C, nb_ColA, nb_ColB, nb_RowA, nb_RowB): none of the signatures
 * mmd knows. Its declaration is the file notebook.kernel.yaml beside it (as
 * for a file its author cannot edit), which says which integer is which.
 *
 * It adds into C (+=): mmd zeroes C before every launch.
 */
#include <stdio.h>
#include <cuda_runtime.h>

__global__
void classicMatMul(float *A, float *B, float *C, int nb_ColA, int nb_ColB, int nb_RowA, int nb_RowB)
{
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = 0; i < nb_ColA; i++) {
        C[row * nb_ColB + col] += A[row * nb_ColA + i] * B[i * nb_ColB + col];
    }
}
